"""completions' text_offset: streamed chunks and the whole response list the same offsets,
also when the engine held a token's text back (an unfinished UTF-8 character)."""
from __future__ import annotations

from kvserve.frontend.backend_client.protocol import ChoiceDelta, TokenLogprob
from kvserve.frontend.openai.logprobs_format import merge_completion_logprobs
from kvserve.frontend.openai.responses import ChoiceState, apply_delta


TEXTS = {1: " h", 2: "\ufffd", 3: "\ufffd", 4: " and"}  # what the gateway's tokenizer renders
TOKENS = [TokenLogprob(i, -0.5) for i in TEXTS]
# Streamed: the two halves of "é" come as one character with the second token.
STREAMED = [ChoiceDelta(0, " h", [1], logprobs=TOKENS[:1]), ChoiceDelta(0, "", [2], logprobs=TOKENS[1:2]),
            ChoiceDelta(0, "é", [3], logprobs=TOKENS[2:3]), ChoiceDelta(0, " and", [4], logprobs=TOKENS[3:])]
WHOLE = [ChoiceDelta(0, " hé and", [1, 2, 3, 4], logprobs=TOKENS)]


def _offsets(deltas: list[ChoiceDelta], echo: str = "") -> tuple[list[list[int]], list[int]]:
    state = ChoiceState(index=0, next_text_offset=len(echo))
    chunks = [apply_delta(state, d, chat=False, token_text=TEXTS.__getitem__)[0]["text_offset"] for d in deltas]
    return chunks, merge_completion_logprobs(state.completion_lp)["text_offset"]


def test_streamed_and_whole_offsets_agree_when_text_was_held_back() -> None:
    chunks, streamed = _offsets(STREAMED)
    assert chunks == [[0], [2], [3], [4]]
    assert streamed == _offsets(WHOLE)[1] == [0, 2, 3, 4]


def test_offsets_start_after_an_echoed_prompt() -> None:
    assert _offsets(WHOLE, echo="hello")[1] == [5, 7, 8, 9]
