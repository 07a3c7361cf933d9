"""The Responses API's typed event stream, as a `StreamShaper` of the one generation driver:

    response.created · response.in_progress
    a message:        response.output_item.added · response.content_part.added ·
                      response.output_text.delta* · response.output_text.done ·
                      response.content_part.done · response.output_item.done
    a function call:  response.output_item.added · response.function_call_arguments.delta* ·
                      response.function_call_arguments.done · response.output_item.done
    response.completed (or response.incomplete when max_output_tokens cut it off)

Every event carries `type` (also its SSE event name) and a `sequence_number` counting from 0. A
backend failure after the headers went out is an `error` event, then `response.failed`.
"""
from __future__ import annotations

from typing import Any, Callable

from kvserve.frontend.http import SseWriter
from kvserve.frontend.openai.api_errors import ApiError
from kvserve.frontend.openai.responses import ChoiceState, Usage
from kvserve.frontend.openai.responses_api.response_object import (ResponseMeta, function_call_item, message_item,
                                                                   new_id, output_text, response_status,
                                                                   usage_body)
from kvserve.frontend.openai.tool_parser import Event

Finished = Callable[[dict[str, Any], list[dict[str, Any]]], None]  # (final Response, its output items)


class ResponseEvents:
    def __init__(self, meta: ResponseMeta, on_finished: Finished) -> None:
        self.meta = meta
        self.on_finished = on_finished
        self.sequence = 0
        self.items: list[dict[str, Any]] = []  # output items so far; the last may be open
        self.open = False
        # include message.output_text.logprobs: entries not yet sent (their tokens' text held back);
        # they go with the next text delta, or with output_text.done
        self.pending_logprobs: list[dict[str, Any]] = []

    async def _send(self, writer: SseWriter, kind: str, **fields: Any) -> None:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        await writer.send_event(kind, payload)

    async def opening(self, writer: SseWriter, choices: list[ChoiceState]) -> None:
        await self._send(writer, "response.created", response=self.meta.body("in_progress", []))
        await self._send(writer, "response.in_progress", response=self.meta.body("in_progress", []))

    async def delta(self, writer: SseWriter, state: ChoiceState, text: str, logprobs: Any,
                    finish_reason: str | None, events: list[Event] | None) -> None:
        self.pending_logprobs.extend(logprobs or [])
        if events is None:
            events = [Event("content", text)] if text else []
        for event in events:
            if event.kind == "content":
                await self._text(writer, event.text)
            elif event.kind == "call":
                await self._close(writer, "completed")
                item = function_call_item(new_id("fc"), event.call.id, event.call.name, "", "in_progress")
                await self._add(writer, item)
            else:
                item = self.items[-1]
                item["arguments"] += event.text
                await self._send(writer, "response.function_call_arguments.delta", item_id=item["id"],
                                 output_index=len(self.items) - 1, delta=event.text)
        if finish_reason:
            if not self.items:  # no output at all: still one (empty) message, as a whole response has
                await self._text(writer, "", force=True)
            await self._close(writer, response_status(state)[0])

    async def _add(self, writer: SseWriter, item: dict[str, Any]) -> None:
        self.items.append(item)
        self.open = True
        await self._send(writer, "response.output_item.added", output_index=len(self.items) - 1, item=dict(item))

    async def _text(self, writer: SseWriter, text: str, force: bool = False) -> None:
        if not text and not force:
            return
        if not (self.open and self.items[-1]["type"] == "message"):
            await self._close(writer, "completed")
            await self._add(writer, message_item(new_id("msg"), "", "in_progress"))
            self.items[-1]["text"], self.items[-1]["logprobs"] = "", []
            await self._send(writer, "response.content_part.added", item_id=self.items[-1]["id"],
                             output_index=len(self.items) - 1, content_index=0, part=output_text(""))
        item = self.items[-1]
        if text:
            item["text"] += text
            sent, self.pending_logprobs = self.pending_logprobs, []
            item["logprobs"] += sent
            await self._send(writer, "response.output_text.delta", item_id=item["id"],
                             output_index=len(self.items) - 1, content_index=0, delta=text, logprobs=sent)

    async def _close(self, writer: SseWriter, status: str) -> None:
        if not self.open:
            return
        self.open = False
        index, item = len(self.items) - 1, self.items[-1]
        if item["type"] == "message":
            text = item.pop("text")
            logprobs, self.pending_logprobs = item.pop("logprobs") + self.pending_logprobs, []
            await self._send(writer, "response.output_text.done", item_id=item["id"], output_index=index,
                             content_index=0, text=text, logprobs=logprobs)
            await self._send(writer, "response.content_part.done", item_id=item["id"], output_index=index,
                             content_index=0, part=output_text(text, logprobs))
            self.items[-1] = item = message_item(item["id"], text, status, logprobs)
        else:
            item["status"] = status
            await self._send(writer, "response.function_call_arguments.done", item_id=item["id"],
                             output_index=index, name=item["name"], arguments=item["arguments"])
        await self._send(writer, "response.output_item.done", output_index=index, item=item)

    async def failed(self, writer: SseWriter, error: ApiError) -> None:
        await self._send(writer, "error", code=error.code, message=error.message, param=error.param)
        if self.open and self.items[-1]["type"] == "message":  # what it had said, as a whole item
            item = self.items[-1]
            self.items[-1] = message_item(item["id"], item.pop("text"), "incomplete", item.pop("logprobs"))
        body = self.meta.body("failed", self.items, error=response_error(error))
        await self._send(writer, "response.failed", response=body)
        await writer.end()

    async def closing(self, writer: SseWriter, choices: list[ChoiceState], usage: Usage) -> None:
        status, incomplete = response_status(choices[0])
        await self._close(writer, status)
        body = self.meta.body(status, self.items, usage_body(usage, choices), incomplete=incomplete)
        self.on_finished(body, self.items)
        await self._send(writer, "response.incomplete" if incomplete else "response.completed", response=body)
        await writer.end()


def response_error(error: ApiError) -> dict[str, Any]:
    """A failed Response's `error`. Its `code` is one of a fixed set (the SDK's ResponseError
    lists them), unlike the `error` event's, which keeps the gateway's own code ("timeout", ...):
    so a bad request maps to invalid_prompt, a 429 to rate_limit_exceeded, anything else to
    server_error, and `type` keeps the error's own type, as OpenAI's field is meant to."""
    if error.status == 429:
        code = "rate_limit_exceeded"
    elif 400 <= error.status < 500 and error.status != 408:
        code = "invalid_prompt"
    else:
        code = "server_error"
    return {"code": code, "message": error.message, "param": error.param, "type": error.type}
