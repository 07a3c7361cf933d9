"""Server-sent-event parsing for OpenAI-style streams, shared by the aiohttp
client and the locustfile (which reads through `requests`).

Kept free of any HTTP library so both transports split lines the same way and
agree on what counts as "content" (the thing TTFT and ITL are measured on).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DONE = "[DONE]"


@dataclass(slots=True)
class StreamEvent:
    """One decoded `data:` payload."""

    done: bool = False
    text: str = ""  # content carried by this chunk ("" for role/usage chunks)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str = ""


class LineSplitter:
    """Reassembles lines from arbitrary byte chunks.

    aiohttp's readline has a line-length cap and `iter_chunked` splits anywhere,
    so we buffer ourselves and only hand out complete lines."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[str]:
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        return [line.rstrip(b"\r").decode("utf-8", errors="replace") for line in lines]

    def flush(self) -> list[str]:
        rest, self._buf = self._buf, b""
        return [rest.rstrip(b"\r").decode("utf-8", errors="replace")] if rest.strip() else []


def data_payload(line: str) -> str | None:
    """The payload of a `data:` line; None for blanks, comments, other fields."""
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


def _content_of(choice: dict[str, Any]) -> str:
    # Completions put text in "text"; chat in "delta.content". Reasoning models
    # stream "reasoning_content" first, which is generated output too.
    if "text" in choice and choice["text"]:
        return str(choice["text"])
    delta = choice.get("delta") or {}
    return str(delta.get("content") or delta.get("reasoning_content") or "")


def parse_payload(payload: str) -> StreamEvent:
    if payload == DONE:
        return StreamEvent(done=True)
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError:
        return StreamEvent(error=f"malformed SSE payload: {payload[:120]!r}")
    if not isinstance(obj, dict):
        return StreamEvent(error=f"unexpected SSE payload: {payload[:120]!r}")
    if "error" in obj:
        err = obj["error"]
        message = err.get("message", err) if isinstance(err, dict) else err
        return StreamEvent(error=f"server error in stream: {message}")
    event = StreamEvent()
    choices = obj.get("choices") or []
    if choices:
        event.text = "".join(_content_of(c) for c in choices if isinstance(c, dict))
    usage = obj.get("usage")
    if isinstance(usage, dict):
        event.prompt_tokens = usage.get("prompt_tokens")
        event.completion_tokens = usage.get("completion_tokens")
    return event
