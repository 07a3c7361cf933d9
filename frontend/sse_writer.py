"""Server-sent events onto an aiohttp StreamResponse, framed by sse_starlette.

OpenAI's stream is `data: <json>\\n\\n` per chunk and a final `data: [DONE]`;
no event names, ids or retry fields.
"""
from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from sse_starlette import ServerSentEvent

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

    @classmethod
    async def open(cls, request: web.Request, headers: dict[str, str] | None = None) -> SseWriter:
        response = web.StreamResponse(status=200, headers={**SSE_HEADERS, **(headers or {})})
        await response.prepare(request)
        return cls(response)

    async def send(self, payload: dict[str, Any]) -> None:
        await self._response.write(encode_json(payload))

    async def done(self) -> None:
        await self._response.write(encode_event(DONE))
        await self._response.write_eof()

    @property
    def response(self) -> web.StreamResponse:
        return self._response
