"""The Messages API's event stream, as a `StreamShaper` of the one generation driver:

    message_start
    content_block_start (text | tool_use) · content_block_delta (text_delta | input_json_delta)* ·
    content_block_stop            ... one block after another
    message_delta (stop_reason, stop_sequence, usage.output_tokens) · message_stop

Each frame is `event: <type>` + `data: <json>` whose own `type` repeats the name. A failure after
the headers went out is an `error` event in Anthropic's error shape, which ends the stream.
"""
from __future__ import annotations

from typing import Any

from kvserve.frontend.http import SseWriter
from kvserve.frontend.openai.anthropic.anthropic_errors import anthropic_error_body
from kvserve.frontend.openai.anthropic.messages_body import StopTail, stop_reason, tool_use_id, usage_body
from kvserve.frontend.openai.api_errors import ApiError
from kvserve.frontend.openai.responses import ChoiceState, Usage
from kvserve.frontend.openai.tool_parser import Event


class MessagesStream:
    def __init__(self, rid: str, model: str, input_tokens: int, stops: list[str]) -> None:
        self.rid, self.model, self.input_tokens = rid, model, input_tokens
        self.tail = StopTail(stops)
        self.index = -1  # of the open (or last) content block
        self.open_kind: str | None = None  # "text" | "tool_use" while a block is open
        self.stop_sequence: str | None = None

    async def _send(self, writer: SseWriter, payload: dict[str, Any]) -> None:
        await writer.send_event(payload["type"], payload)

    async def opening(self, writer: SseWriter, choices: list[ChoiceState]) -> None:
        await self._send(writer, {"type": "message_start", "message": {
            "id": self.rid, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}}})

    async def delta(self, writer: SseWriter, state: ChoiceState, text: str, logprobs: Any,
                    finish_reason: str | None, events: list[Event] | None) -> None:
        if events is None:
            events = [Event("content", text)] if text else []
        for event in events:
            if event.kind == "content":
                await self._text(writer, self.tail.feed(event.text))
            elif event.kind == "call":
                await self._text(writer, self.tail.flush())
                await self._open(writer, "tool_use", {"type": "tool_use", "id": tool_use_id(event.call.id),
                                                      "name": event.call.name, "input": {}})
            else:
                await self._send(writer, {"type": "content_block_delta", "index": self.index,
                                          "delta": {"type": "input_json_delta", "partial_json": event.text}})
        if finish_reason:
            rest, self.stop_sequence = self.tail.finish(finish_reason == "stop")
            await self._text(writer, rest)
            await self._close(writer)

    async def _text(self, writer: SseWriter, text: str) -> None:
        if not text:
            return
        if self.open_kind != "text":
            await self._open(writer, "text", {"type": "text", "text": ""})
        await self._send(writer, {"type": "content_block_delta", "index": self.index,
                                  "delta": {"type": "text_delta", "text": text}})

    async def _open(self, writer: SseWriter, kind: str, block: dict[str, Any]) -> None:
        await self._close(writer)
        self.index += 1
        self.open_kind = kind
        await self._send(writer, {"type": "content_block_start", "index": self.index, "content_block": block})

    async def _close(self, writer: SseWriter) -> None:
        if self.open_kind is not None:
            self.open_kind = None
            await self._send(writer, {"type": "content_block_stop", "index": self.index})

    async def failed(self, writer: SseWriter, error: ApiError) -> None:
        await self._send(writer, anthropic_error_body(error))
        await writer.end()

    async def closing(self, writer: SseWriter, choices: list[ChoiceState], usage: Usage) -> None:
        await self._close(writer)
        state = choices[0]
        await self._send(writer, {"type": "message_delta",
                                  "delta": {"stop_reason": stop_reason(state.finish_reason, self.stop_sequence),
                                            "stop_sequence": self.stop_sequence},
                                  "usage": {"output_tokens": usage_body(usage, choices)["output_tokens"]}})
        await self._send(writer, {"type": "message_stop"})
        await writer.end()
