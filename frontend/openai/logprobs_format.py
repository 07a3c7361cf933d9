"""The engine's per-token logprobs in OpenAI's two wire formats.

completions: parallel lists {tokens, token_logprobs, top_logprobs: [{token: lp}], text_offset}
chat:        {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}

The engine sends numbers (token ids and logprobs); `token_text` renders a token
id as its text here, with the gateway's tokenizer (`Gateway.token_text`).
"""
from __future__ import annotations

from typing import Any, Callable

from kvserve.frontend.backend_client import TokenLogprob

TokenText = Callable[[int], str]


def completion_logprobs(entries: list[TokenLogprob], text_offset: int, token_text: TokenText) -> dict[str, Any]:
    """`text_offset` is where the first of these tokens starts in the choice's text
    (so streamed chunks continue the count of the chunks before them)."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for e in entries:
        token = token_text(e.token_id)
        tokens.append(token)
        token_logprobs.append(e.logprob)
        top = {token_text(t.token_id): t.logprob for t in e.top_logprobs}
        top.setdefault(token, e.logprob)  # as vLLM: the sampled token is always listed
        tops.append(top)
        offsets.append(text_offset)
        text_offset += len(token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def merge_completion_logprobs(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not parts:
        return None
    merged: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for part in parts:
        for key in merged:
            merged[key].extend(part[key])
    return merged


def _chat_entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def chat_logprobs(entries: list[TokenLogprob], token_text: TokenText) -> list[dict[str, Any]]:
    return [
        {
            **_chat_entry(token_text(e.token_id), e.logprob),
            "top_logprobs": [_chat_entry(token_text(t.token_id), t.logprob) for t in e.top_logprobs],
        }
        for e in entries
    ]
