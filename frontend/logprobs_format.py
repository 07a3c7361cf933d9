"""The engine's per-token logprobs in OpenAI's two wire formats.

completions: parallel lists {tokens, token_logprobs, top_logprobs: [{token: lp}], text_offset}
chat:        {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}
"""
from __future__ import annotations

from typing import Any

from kvserve.frontend.protocol import TokenLogprob


def _bytes(entry_bytes: list[int] | None, token: str) -> list[int]:
    return list(entry_bytes) if entry_bytes is not None else list(token.encode("utf-8"))


def completion_logprobs(entries: list[TokenLogprob], text_offset: int) -> dict[str, Any]:
    """`text_offset` is where the first of these tokens starts in the choice's text
    (so streamed chunks continue the count of the chunks before them)."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for e in entries:
        tokens.append(e.token)
        token_logprobs.append(e.logprob)
        top = {t.token: t.logprob for t in e.top_logprobs}
        top.setdefault(e.token, e.logprob)  # as vLLM: the sampled token is always listed
        tops.append(top)
        offsets.append(text_offset)
        text_offset += len(e.token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def merge_completion_logprobs(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not parts:
        return None
    merged: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for part in parts:
        for key in merged:
            merged[key].extend(part[key])
    return merged


def chat_logprobs(entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    return [
        {
            "token": e.token,
            "logprob": e.logprob,
            "bytes": _bytes(e.bytes, e.token),
            "top_logprobs": [
                {"token": t.token, "logprob": t.logprob, "bytes": _bytes(t.bytes, t.token)} for t in e.top_logprobs
            ],
        }
        for e in entries
    ]
