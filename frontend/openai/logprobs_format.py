"""The engine's per-token logprobs in OpenAI's two wire formats.

completions: parallel lists {tokens, token_logprobs, top_logprobs: [{token: lp}], text_offset}
chat:        {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}

The engine sends numbers (token ids and logprobs); `token_text` renders a token
id as its text here, with the gateway's tokenizer (`Gateway.token_text`), and
`token_bytes` gives its own bytes (`Gateway.token_bytes`): a token that holds part
of a character reads as U+FFFD, while its `bytes` (chat) are the real ones, and
the text_offsets (completions) count the characters its bytes complete.
"""
from __future__ import annotations

import codecs
from typing import Any, Callable

from kvserve.frontend.backend_client import TokenLogprob

TokenText = Callable[[int], str]
TokenBytes = Callable[[int], bytes]


class TextOffsets:
    """completions' text_offset: where each token starts in the choice's text. A token starts
    after the characters that the bytes before it complete, so the three tokens of "😀" all
    start where the emoji does, and the token after them one character later."""

    def __init__(self, start: int = 0) -> None:
        self.next = start
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def advance(self, data: bytes) -> int:
        """The offset of a token with these bytes; the ones after it count from past it."""
        at = self.next
        self.next += len(self._utf8.decode(data))
        return at


def completion_logprobs(entries: list[TokenLogprob], offsets: TextOffsets, token_text: TokenText,
                        token_bytes: TokenBytes) -> dict[str, Any]:
    """`offsets` continues the choice's count (streamed chunks go on from the chunks before them)."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    text_offsets: list[int] = []
    for e in entries:
        token = token_text(e.token_id)
        tokens.append(token)
        token_logprobs.append(e.logprob)
        if e.logprob is None:  # an echoed prompt's first token: null, as OpenAI lists it
            tops.append(None)
        else:
            top = {token_text(t.token_id): t.logprob for t in e.top_logprobs}
            top.setdefault(token, e.logprob)  # as vLLM: the sampled token is always listed
            tops.append(top)
        text_offsets.append(offsets.advance(token_bytes(e.token_id)))
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": text_offsets}


def merge_completion_logprobs(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not parts:
        return None
    merged: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for part in parts:
        for key in merged:
            merged[key].extend(part[key])
    return merged


def _chat_entry(token_id: int, logprob: float, token_text: TokenText, token_bytes: TokenBytes) -> dict[str, Any]:
    return {"token": token_text(token_id), "logprob": logprob, "bytes": list(token_bytes(token_id))}


def chat_logprobs(entries: list[TokenLogprob], token_text: TokenText, token_bytes: TokenBytes) -> list[dict[str, Any]]:
    return [
        {
            **_chat_entry(e.token_id, e.logprob, token_text, token_bytes),
            "top_logprobs": [_chat_entry(t.token_id, t.logprob, token_text, token_bytes) for t in e.top_logprobs],
        }
        for e in entries
    ]


def vllm_prompt_logprobs(entries: list[TokenLogprob] | None, token_text: TokenText) -> list[Any] | None:
    """vLLM's `prompt_logprobs`: per prompt token, null for the first, else {token id: {logprob,
    rank, decoded_token}} holding the token itself, then the top k at its place (ranks 1..k)."""
    if entries is None:
        return None
    listed: list[Any] = []
    for e in entries:
        if e.logprob is None:
            listed.append(None)
            continue
        place = {str(e.token_id): {"logprob": e.logprob, "rank": e.rank, "decoded_token": token_text(e.token_id)}}
        for rank, t in enumerate(e.top_logprobs, start=1):
            place.setdefault(str(t.token_id), {"logprob": t.logprob, "rank": rank,
                                               "decoded_token": token_text(t.token_id)})
        listed.append(place)
    return listed
