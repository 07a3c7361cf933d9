"""Server-sent events onto an aiohttp StreamResponse, framed by sse_starlette.

OpenAI's chat and completion streams are `data: <json>\\n\\n` per chunk and a final
`data: [DONE]`, with no event names. The Responses and Messages APIs name each event
(`event: <type>\\ndata: <json>\\n\\n`) and end without a sentinel: `send_event` and `end`.
"""
from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from sse_starlette import ServerSentEvent

from kvserve.frontend.http.write_stall import WriteStallWatch

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    # Reverse proxies (nginx) buffer responses unless told not to; tokens must flow.
    "X-Accel-Buffering": "no",
}
DONE = "[DONE]"
# Built once: json.dumps with any non-default option builds a new encoder per call.
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def encode_event(data: str) -> bytes:
    return ServerSentEvent(data=data, sep="\n").encode()


def encode_json(payload: dict[str, Any]) -> bytes:
    # One frame per streamed token. JSON text never holds a raw CR or LF (the
    # encoder escapes them in strings), and those are SSE's only line breaks, so
    # the payload is one `data:` line and needs none of the general framing.
    return b"data: " + _JSON.encode(payload).encode("utf-8") + b"\n\n"


class SseWriter:
    def __init__(self, response: web.StreamResponse) -> None:
        self._response = response
        self._written = 0
        self._watch: WriteStallWatch | None = None

    @classmethod
    async def open(cls, request: web.Request, headers: dict[str, str] | None = None,
                   write_timeout: float | None = None, name: str = "") -> SseWriter:
        """With `write_timeout`, a client that reads nothing for that long loses the connection
        (write_stall.py); call close() when the stream ends."""
        response = web.StreamResponse(status=200, headers={**SSE_HEADERS, **(headers or {})})
        await response.prepare(request)
        writer = cls(response)
        if write_timeout is not None and request.transport is not None:
            writer._watch = WriteStallWatch(request.transport, lambda: writer._written, write_timeout, name)
        return writer

    async def _write(self, data: bytes) -> None:
        self._written += len(data)
        await self._response.write(data)

    async def send(self, payload: dict[str, Any]) -> None:
        await self._write(encode_json(payload))

    async def send_event(self, event: str, payload: dict[str, Any]) -> None:
        # The event names are the server's own constants (no CR or LF), so one line each.
        await self._write(b"event: " + event.encode("ascii") + b"\n" + encode_json(payload))

    async def end(self) -> None:
        """End a stream of named events (no [DONE] sentinel)."""
        await self._response.write_eof()

    async def done(self) -> None:
        await self._write(encode_event(DONE))
        await self._response.write_eof()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.stop()

    @property
    def response(self) -> web.StreamResponse:
        return self._response
