"""completions' text_offset: streamed chunks and the whole response list the same offsets,
also when the engine held a token's text back (an unfinished UTF-8 character), and each offset
is where its token starts in the text; chat's `bytes` are each token's own bytes."""
from __future__ import annotations

from kvserve.frontend.backend_client.protocol import ChoiceDelta, TokenLogprob
from kvserve.frontend.openai.logprobs_format import TextOffsets, merge_completion_logprobs
from kvserve.frontend.openai.responses import ChoiceState, apply_delta

# " hé and", with "é" (C3 A9) split over two tokens that each render alone as U+FFFD
TEXTS = {1: " h", 2: "\ufffd", 3: "\ufffd", 4: " and"}  # what the gateway's tokenizer renders
BYTES = {1: b" h", 2: b"\xc3", 3: b"\xa9", 4: b" and"}
TOKENS = [TokenLogprob(i, -0.5) for i in TEXTS]
# Streamed: the two halves of "é" come as one character with the second token.
STREAMED = [ChoiceDelta(0, " h", [1], logprobs=TOKENS[:1]), ChoiceDelta(0, "", [2], logprobs=TOKENS[1:2]),
            ChoiceDelta(0, "é", [3], logprobs=TOKENS[2:3]), ChoiceDelta(0, " and", [4], logprobs=TOKENS[3:])]
WHOLE = [ChoiceDelta(0, " hé and", [1, 2, 3, 4], logprobs=TOKENS)]


def _apply(state: ChoiceState, delta: ChoiceDelta, chat: bool = False):
    return apply_delta(state, delta, chat=chat, token_text=TEXTS.__getitem__, token_bytes=BYTES.__getitem__)[0]


def _offsets(deltas: list[ChoiceDelta], echo: str = "") -> tuple[list[list[int]], list[int]]:
    state = ChoiceState(index=0, text_offsets=TextOffsets(len(echo)))
    chunks = [_apply(state, d)["text_offset"] for d in deltas]
    return chunks, merge_completion_logprobs(state.completion_lp)["text_offset"]


def test_streamed_and_whole_offsets_agree_when_text_was_held_back() -> None:
    chunks, streamed = _offsets(STREAMED)
    assert chunks == [[0], [2], [2], [3]]
    assert streamed == _offsets(WHOLE)[1] == [0, 2, 2, 3]
    text = " hé and"
    assert text[3:] == " and" and text[2] == "é"  # each token starts where its first byte's character does


def test_offsets_start_after_an_echoed_prompt() -> None:
    assert _offsets(WHOLE, echo="hello")[1] == [5, 7, 7, 8]


def test_chat_bytes_are_each_tokens_own_and_join_to_the_text() -> None:
    entries = _apply(ChoiceState(index=0), WHOLE[0], chat=True)
    assert [e["token"] for e in entries] == [" h", "\ufffd", "\ufffd", " and"]
    assert [e["bytes"] for e in entries] == [[32, 104], [0xC3], [0xA9], [32, 97, 110, 100]]
    assert bytes(b for e in entries for b in e["bytes"]).decode() == " hé and"
