"""Drive the backend requests of one OpenAI call and shape what comes back:
a whole JSON response, or an SSE stream of chunks ending in `[DONE]`.

Shared by /v1/completions and /v1/chat/completions; the `chat` flag picks the
wire format. Choices are numbered `prompt_index * n + i`, as OpenAI does.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import AsyncIterator

from aiohttp import web

from kvserve.frontend.backend_client import (BackendError, BackendFailed, BackendUnavailable, ChoiceDelta, Fanout,
                                             GenerateRequest, annotate_request, annotate_response)
from kvserve.frontend.http import Gateway, SseWriter, request_id, request_span
from kvserve.frontend.openai.api_errors import ApiError, from_backend
from kvserve.frontend.openai.responses import (
    ChoiceState,
    ChunkFactory,
    Usage,
    apply_delta,
    chat_body,
    completion_body,
    finish_with_tools,
    tool_call_json,
)
from kvserve.frontend.openai.tool_parser import Event, HermesToolParser
from kvserve.frontend.openai.tools import ToolRequest

log = logging.getLogger("kvserve.frontend.openai.generation")


@dataclass(slots=True)
class Call:
    """One OpenAI call, already validated."""

    rid: str
    created: int
    model: str
    n: int
    chat: bool
    logprobs: bool
    include_usage: bool
    echo_texts: list[str] | None = None  # completions `echo`: prompt text per prompt
    constraint_param: str | None = None  # where a structured-output constraint came from
    tools: ToolRequest | None = None  # chat with tools: tool calls are parsed out of the text

    @property
    def prompt_param(self) -> str:
        return "messages" if self.chat else "prompt"

    @property
    def object_name(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"


def _choices(call: Call, num_prompts: int) -> list[ChoiceState]:
    return [ChoiceState(index=i) for i in range(num_prompts * call.n)]


def _state_for(call: Call, choices: list[ChoiceState], prompt_index: int, delta: ChoiceDelta) -> ChoiceState:
    if not 0 <= delta.index < call.n:
        raise BackendFailed(f"backend sent choice index {delta.index} for n={call.n}")
    return choices[prompt_index * call.n + delta.index]


def _api_error(gateway: Gateway, call: Call, exc: Exception) -> ApiError:
    if isinstance(exc, BackendUnavailable):
        assert gateway.readiness is not None
        gateway.readiness.invalidate()
    if not isinstance(exc, ApiError):
        log.warning("request %s failed in the backend: %s", call.rid, exc)
    return exc if isinstance(exc, ApiError) else from_backend(exc, prompt_param=call.prompt_param,
                                                              constraint_param=call.constraint_param)


@contextlib.asynccontextmanager
async def _fanout(gateway: Gateway, subs: list[GenerateRequest], request: web.Request | None = None,
                  ) -> AsyncIterator[Fanout]:
    """A Fanout the gateway knows about while it runs: graceful shutdown waits
    for `gateway.active` to empty and aborts what is left at its deadline.

    With `request` (a stream), output the client leaves unread is capped at
    --max-stream-buffer-bytes: past it the backend requests are cancelled and the
    connection is dropped (a client that does not read cannot be sent an error)."""
    def drop_client() -> None:
        assert request is not None
        log.warning("stream %s cancelled: the client left over %d bytes unread", subs[0].request_id if subs else "",
                    gateway.config.max_stream_buffer_bytes)
        if request.transport is not None:
            request.transport.abort()  # a write blocked on the full socket fails now

    cap = gateway.config.max_stream_buffer_bytes if request is not None else None
    async with Fanout(gateway.backend, subs, max_buffered_bytes=cap,
                      on_overflow=drop_client if request is not None else None) as fan:
        gateway.active.add(fan)
        try:
            yield fan
        finally:
            gateway.active.discard(fan)


async def respond(request: web.Request, gateway: Gateway, call: Call, subs: list[GenerateRequest], stream: bool) -> web.StreamResponse:
    annotate_request(request_span(), response_id=call.rid, model=call.model, chat=call.chat,
                     sampling=subs[0].sampling if subs else {})
    if stream:
        return await _stream(request, gateway, call, subs)
    return await _collect(gateway, call, subs)


async def _collect(gateway: Gateway, call: Call, subs: list[GenerateRequest]) -> web.Response:
    choices = _choices(call, len(subs))
    if call.echo_texts is not None:
        for state in choices:
            text = call.echo_texts[state.index // call.n]
            state.text.append(text)
            state.next_text_offset = len(text)
    usage = Usage()
    try:
        async with _fanout(gateway, subs) as fan:
            async for prompt_index, delta in fan:
                usage.observe(prompt_index, delta)
                apply_delta(_state_for(call, choices, prompt_index, delta), delta, chat=call.chat,
                            token_text=gateway.token_text)
    except BackendError as exc:
        raise _api_error(gateway, call, exc) from None
    if call.tools is not None and call.tools.parses_calls:
        for state in choices:
            _read_tool_calls(call, state)
    annotate_response(request_span(), usage.body(choices), [c.finish_reason for c in choices])
    build = chat_body if call.chat else completion_body
    return web.json_response(build(call.rid, call.created, call.model, choices, usage, call.logprobs))


def _parser(call: Call) -> HermesToolParser:
    return HermesToolParser(max_calls=None if call.tools is None or call.tools.parallel else 1)


def _read_tool_calls(call: Call, state: ChoiceState) -> None:
    """Whole response: the same parser as a stream, fed everything at once."""
    parser = _parser(call)
    events = parser.feed("".join(state.text)) + parser.finish()
    state.text = [e.text for e in events if e.kind == "content"]
    if parser.calls:
        state.tool_calls = [tool_call_json(c.id, c.name, c.arguments) for c in parser.calls]
    state.finish_reason = finish_with_tools(state.finish_reason, bool(parser.calls))


def _tool_deltas(events: list[Event]) -> list[dict]:
    """Chunk deltas in OpenAI's format: content, a call's id and name, its arguments fragments."""
    out: list[dict] = []
    for e in events:
        if e.kind == "content":
            out.append({"content": e.text})
        elif e.kind == "call":
            out.append({"tool_calls": [{"index": e.call.index, **tool_call_json(e.call.id, e.call.name, "")}]})
        else:
            out.append({"tool_calls": [{"index": e.call.index, "function": {"arguments": e.text}}]})
    return out


async def _stream(request: web.Request, gateway: Gateway, call: Call, subs: list[GenerateRequest]) -> web.StreamResponse:
    choices = _choices(call, len(subs))
    parsers = {s.index: _parser(call) for s in choices} if call.tools is not None and call.tools.parses_calls else None
    usage = Usage()
    chunks = ChunkFactory(call.rid, call.created, call.model, call.include_usage)
    async with _fanout(gateway, subs, request) as fan:
        try:
            await fan.prefetch()
        except BackendError as exc:
            raise _api_error(gateway, call, exc) from None
        writer = await SseWriter.open(request, {"X-Request-Id": request_id()},
                                      write_timeout=gateway.config.write_timeout, name=call.rid)
        gateway.metrics.stream_started()
        try:
            for state in choices:  # the opening chunk of each choice
                if call.chat:
                    await writer.send(chunks.chat(state.index, {"role": "assistant", "content": ""}, None, None))
                elif call.echo_texts is not None:
                    text = call.echo_texts[state.index // call.n]
                    state.next_text_offset = len(text)
                    await writer.send(chunks.completion(state.index, text, None, None))
            try:
                async for prompt_index, delta in fan:
                    usage.observe(prompt_index, delta)
                    state = _state_for(call, choices, prompt_index, delta)
                    logprobs, text = apply_delta(state, delta, chat=call.chat, token_text=gateway.token_text)
                    if parsers is not None:
                        await _send_tool_deltas(writer, chunks, state, parsers[state.index], text, logprobs,
                                                delta.finish_reason)
                        continue
                    if not text and logprobs is None and not delta.finish_reason:
                        continue  # nothing to tell the client (e.g. text held back for a stop string)
                    if call.chat:
                        body = {"content": text} if text or not delta.finish_reason else {}
                        await writer.send(chunks.chat(state.index, body, logprobs, delta.finish_reason))
                    else:
                        await writer.send(chunks.completion(state.index, text, logprobs, delta.finish_reason))
            except BackendError as exc:
                if fan.overflowed:
                    return writer.response  # the connection is gone (see _fanout)
                # Headers are gone already: the error travels as an event, then [DONE].
                await writer.send(_api_error(gateway, call, exc).body())
                await writer.done()
                return writer.response
            if call.include_usage:
                await writer.send(chunks.usage(call.object_name, usage.body(choices)))
            await writer.done()
        except ConnectionError:
            pass  # the client went away; leaving the `async with` cancels the backend requests
        finally:
            writer.close()
            gateway.metrics.stream_finished()
            annotate_response(request_span(), usage.body(choices), [c.finish_reason for c in choices])
        return writer.response


async def _send_tool_deltas(writer: SseWriter, chunks: ChunkFactory, state: ChoiceState, parser: HermesToolParser,
                            text: str, logprobs, finish_reason: str | None) -> None:
    events = parser.feed(text) if text else []
    if finish_reason:
        events += parser.finish()
    deltas = _tool_deltas(events)
    if logprobs is not None and not deltas and not finish_reason:
        deltas = [{}]  # the logprobs of text the parser holds back still go out with this delta
    for i, body in enumerate(deltas):
        await writer.send(chunks.chat(state.index, body, logprobs if i == 0 else None, None))
    if finish_reason:
        state.finish_reason = finish_with_tools(finish_reason, bool(parser.calls))
        await writer.send(chunks.chat(state.index, {}, None if deltas else logprobs, state.finish_reason))
