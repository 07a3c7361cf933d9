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


def encode_event(data: str) -> bytes:
    return ServerSentEvent(data=data, sep="\n").encode()


def encode_json(payload: dict[str, Any]) -> bytes:
    return encode_event(json.dumps(payload, ensure_ascii=False, separators=(",", ":")))


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
