"""Drive the backend requests of one call and shape what comes back: a whole JSON response, or an
SSE stream.

Every generating route rides this one path: /v1/completions and /v1/chat/completions, and the
Responses (responses_api/) and Messages (anthropic/) routes, which turn their requests into a chat
request first. The driver reads the backend (fan-out, prefetch so early errors are real HTTP
errors, the write-stall and unread-output caps, cancellation when the client leaves), folds each
delta into its choice and runs the tool-call parser; a `StreamShaper` only writes the route's own
wire format, and `collect` hands the whole choices to the route's body builder. Choices are
numbered `prompt_index * n + i`, as OpenAI does.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Protocol

from aiohttp import web

from kvserve.frontend.backend_client import (BackendClient, BackendError, BackendFailed, BackendUnavailable,
                                             ChoiceDelta, Fanout, GenerateRequest, annotate_request, annotate_response)
from kvserve.frontend.http import Gateway, SseWriter, request_id, request_span
from kvserve.frontend.openai.api_errors import ApiError, from_backend
from kvserve.frontend.openai.logprobs_format import (TextOffsets, TokenText, completion_logprobs,
                                                     merge_completion_logprobs, vllm_prompt_logprobs)
from kvserve.frontend.openai.responses import (
    ChoiceState,
    ChunkFactory,
    Usage,
    apply_delta,
    chat_body,
    compare_prediction,
    completion_body,
    finish_with_tools,
    tool_call_json,
)
from kvserve.frontend.openai.tool_parser import Event, HermesToolParser
from kvserve.frontend.openai.tools import ToolRequest

log = logging.getLogger("kvserve.frontend.openai.generation")


@dataclass(slots=True)
class Call:
    """One generating call, already validated."""

    rid: str
    created: int
    model: str
    n: int
    chat: bool
    logprobs: bool
    include_usage: bool
    echo_texts: list[str] | None = None  # `echo`: prompt text per prompt (chat: the final assistant message)
    constraint_param: str | None = None  # where a structured-output constraint came from
    tools: ToolRequest | None = None  # chat with tools: tool calls are parsed out of the text
    input_param: str | None = None  # the field the prompt came from when not messages/prompt ("input")
    prompt_logprobs: bool = False  # vLLM's prompt_logprobs: listed in the (whole) response
    echo_only: bool = False  # completions' echo with max_tokens 0: the token the engine made is dropped
    # vLLM's return_token_ids: each prompt's token ids (the response lists them, and each choice's)
    prompt_token_ids: list[list[int]] | None = None
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N"
    backend: BackendClient | None = None  # who runs the call's requests (beam search); None: the gateway's backend
    continuous_usage: bool = False  # vLLM's continuous_usage_stats: each chunk carries its choice's usage so far
    prediction_ids: list[int] | None = None  # OpenAI's predicted output, tokenized: usage compares the reply to it

    @property
    def prompt_param(self) -> str:
        if self.input_param is not None:
            return self.input_param
        return "messages" if self.chat else "prompt"

    @property
    def object_name(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    @property
    def parses_tool_calls(self) -> bool:
        return self.tools is not None and self.tools.parses_calls


class StreamShaper(Protocol):
    """Writes one route's stream format. The driver (`stream`) calls `opening` once the backend
    answered, `delta` for each delta in order, then `closing` or (a backend failure after the
    headers went out) `failed`. `events` is None unless the call parses tool calls: then it holds
    what the parser read out of this delta's text (content, a call's start, arguments fragments),
    and `state.finish_reason` is already "tool_calls" where the model stopped after calling."""

    async def opening(self, writer: SseWriter, choices: list[ChoiceState]) -> None: ...

    async def delta(self, writer: SseWriter, state: ChoiceState, text: str, logprobs: Any,
                    finish_reason: str | None, events: list[Event] | None) -> None: ...

    async def failed(self, writer: SseWriter, error: ApiError) -> None: ...

    async def closing(self, writer: SseWriter, choices: list[ChoiceState], usage: Usage) -> None: ...


def _choices(call: Call, num_prompts: int) -> list[ChoiceState]:
    ids = call.prompt_token_ids is not None or call.prediction_ids is not None
    return [ChoiceState(index=i, token_ids=[] if ids else None) for i in range(num_prompts * call.n)]


def _token_text(gateway: Gateway, call: Call) -> TokenText:
    """How logprobs name a token: its text, or "token_id:N" (vLLM's return_tokens_as_token_ids,
    for tokens whose text is not a whole character)."""
    return _as_token_id if call.tokens_as_ids else gateway.token_text


def _as_token_id(token_id: int) -> str:
    return f"token_id:{token_id}"


def _add_token_ids(body: dict[str, Any], call: Call, choices: list[ChoiceState]) -> None:
    """vLLM's return_token_ids in a whole response: the prompt's ids (chat: once; completions: per
    choice) and each choice's generated ids."""
    assert call.prompt_token_ids is not None
    if call.chat:
        body["prompt_token_ids"] = call.prompt_token_ids[0]
    for choice, state in zip(body["choices"], choices):
        if not call.chat:
            choice["prompt_token_ids"] = call.prompt_token_ids[state.index // call.n]
        choice["token_ids"] = state.token_ids


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
async def _fanout(gateway: Gateway, call: Call, subs: list[GenerateRequest], request: web.Request | None = None,
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
    async with Fanout(call.backend or gateway.backend, subs, max_buffered_bytes=cap,
                      on_overflow=drop_client if request is not None else None) as fan:
        gateway.active.add(fan)
        try:
            yield fan
        finally:
            gateway.active.discard(fan)


def annotate_call(call: Call, subs: list[GenerateRequest]) -> None:
    """The server span's gen_ai.request.* attributes, once per call."""
    annotate_request(request_span(), response_id=call.rid, model=call.model, chat=call.chat,
                     sampling=subs[0].sampling if subs else {}, lora_name=subs[0].lora_name if subs else None)


async def respond(request: web.Request, gateway: Gateway, call: Call, subs: list[GenerateRequest], stream: bool) -> web.StreamResponse:
    """The OpenAI routes: chat.completion / text_completion bodies and chunks."""
    annotate_call(call, subs)
    if stream:
        usage = Usage()
        return await stream_call(request, gateway, call, subs, ChunkShaper(call, usage), usage)
    choices, usage = await collect(gateway, call, subs)
    build = chat_body if call.chat else completion_body
    body = build(call.rid, call.created, call.model, choices, usage, call.logprobs)
    if call.prompt_token_ids is not None:
        _add_token_ids(body, call, choices)
    if call.prompt_logprobs:  # as vLLM places them: per choice in completions, once for a chat
        listed = [vllm_prompt_logprobs(c.prompt_entries, _token_text(gateway, call)) for c in choices]
        if call.chat:
            body["prompt_logprobs"] = listed[0]
        else:
            for choice, entries in zip(body["choices"], listed):
                choice["prompt_logprobs"] = entries
    return web.json_response(body)


async def collect(gateway: Gateway, call: Call, subs: list[GenerateRequest]) -> tuple[list[ChoiceState], Usage]:
    """Run the call to its end: every choice's text (tool calls read out of it) and the usage."""
    choices = _choices(call, len(subs))
    if call.echo_texts is not None:
        for state in choices:
            text = call.echo_texts[state.index // call.n]
            state.text.append(text)
            state.text_offsets = TextOffsets(len(text))
    usage = Usage()
    try:
        async with _fanout(gateway, call, subs) as fan:
            async for prompt_index, delta in fan:
                usage.observe(prompt_index, delta)
                delta = _received(gateway, call, choices, prompt_index, delta)
                apply_delta(_state_for(call, choices, prompt_index, delta), delta, chat=call.chat,
                            token_text=_token_text(gateway, call), token_bytes=gateway.token_bytes)
    except BackendError as exc:
        raise _api_error(gateway, call, exc) from None
    if call.parses_tool_calls:
        for state in choices:
            _read_tool_calls(call, state)
    if call.prediction_ids is not None:
        await compare_prediction(usage, call.prediction_ids, choices)
    annotate_response(request_span(), usage.body(choices), [c.finish_reason for c in choices])
    return choices, usage


def _received(gateway: Gateway, call: Call, choices: list[ChoiceState], prompt_index: int,
              delta: ChoiceDelta) -> ChoiceDelta:
    """A delta as the choices take it. A prompt's logprobs (one delta of the prompt carries them,
    before any of its choices' tokens) go to each of that prompt's choices; with completions'
    echo and logprobs they head the choice's logprobs. With echo alone (max_tokens 0), the
    generated token is dropped: the choice is its prompt, ended by the length limit."""
    if delta.prompt_logprobs is not None:
        _take_prompt_logprobs(gateway, call, choices, prompt_index, delta)
    if not call.echo_only:
        return delta
    finish = "length" if delta.finish_reason in ("stop", "length") else delta.finish_reason
    return ChoiceDelta(delta.index, finish_reason=finish, prompt_tokens=delta.prompt_tokens,
                       cached_tokens=delta.cached_tokens)


def _take_prompt_logprobs(gateway: Gateway, call: Call, choices: list[ChoiceState], prompt_index: int,
                          delta: ChoiceDelta) -> None:
    part = None
    if call.echo_texts is not None and call.logprobs and not call.chat:
        part = completion_logprobs(delta.prompt_logprobs, TextOffsets(), _token_text(gateway, call), gateway.token_bytes)
    for state in choices[prompt_index * call.n:(prompt_index + 1) * call.n]:
        state.prompt_entries, state.prompt_lp = delta.prompt_logprobs, part


def _parser(call: Call) -> HermesToolParser:
    tools = call.tools
    return HermesToolParser(max_calls=None if tools is None or tools.parallel else 1,
                            calls_only=tools is not None and tools.forced)


def _read_tool_calls(call: Call, state: ChoiceState) -> None:
    """Whole response: the same parser as a stream, fed everything at once."""
    parser = _parser(call)
    events = parser.feed("".join(state.text)) + parser.finish()
    state.text = [e.text for e in events if e.kind == "content"]
    if parser.calls:
        state.tool_calls = [tool_call_json(c.id, c.name, c.arguments) for c in parser.calls]
    state.finish_reason = finish_with_tools(state.finish_reason, bool(parser.calls))


async def stream_call(request: web.Request, gateway: Gateway, call: Call, subs: list[GenerateRequest],
                      shaper: StreamShaper, usage: Usage | None = None) -> web.StreamResponse:
    """Stream the call through `shaper`. An error before the first delta is raised (a real HTTP
    status, in the route's error shape); one after the headers went out goes to `shaper.failed`.
    `usage`: the call's usage as the deltas tell it, for a shaper that reads it as it goes."""
    choices = _choices(call, len(subs))
    parsers = {s.index: _parser(call) for s in choices} if call.parses_tool_calls else None
    usage = Usage() if usage is None else usage
    async with _fanout(gateway, call, subs, request) as fan:
        try:
            await fan.prefetch()
        except BackendError as exc:
            raise _api_error(gateway, call, exc) from None
        for prompt_index, delta in fan.prefetched:  # the prompts' sizes, before the opening chunks
            usage.observe(prompt_index, delta)
        writer = await SseWriter.open(request, {"X-Request-Id": request_id()},
                                      write_timeout=gateway.config.write_timeout, name=call.rid)
        gateway.metrics.stream_started()
        try:
            await shaper.opening(writer, choices)
            try:
                async for prompt_index, delta in fan:
                    usage.observe(prompt_index, delta)
                    delta = _received(gateway, call, choices, prompt_index, delta)
                    state = _state_for(call, choices, prompt_index, delta)
                    logprobs, text = apply_delta(state, delta, chat=call.chat, token_text=_token_text(gateway, call),
                                                 token_bytes=gateway.token_bytes)
                    events = None
                    if parsers is not None:
                        parser = parsers[state.index]
                        events = parser.feed(text) if text else []
                        if delta.finish_reason:
                            events += parser.finish()
                            state.finish_reason = finish_with_tools(delta.finish_reason, bool(parser.calls))
                    await shaper.delta(writer, state, text, logprobs, delta.finish_reason, events)
            except BackendError as exc:
                if fan.overflowed:
                    return writer.response  # the connection is gone (see _fanout)
                # Headers are gone already: the error travels inside the stream.
                await shaper.failed(writer, _api_error(gateway, call, exc))
                return writer.response
            if call.prediction_ids is not None:
                await compare_prediction(usage, call.prediction_ids, choices)
            await shaper.closing(writer, choices, usage)
        except ConnectionError:
            pass  # the client went away; leaving the `async with` cancels the backend requests
        finally:
            writer.close()
            gateway.metrics.stream_finished()
            annotate_response(request_span(), usage.body(choices), [c.finish_reason for c in choices])
        return writer.response


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


class ChunkShaper:
    """OpenAI's chunks: `chat.completion.chunk` or `text_completion`, then `data: [DONE]`."""

    def __init__(self, call: Call, usage: Usage) -> None:
        self.call = call
        self.usage = usage  # stream_call's, as the deltas so far tell it
        self.chunks = ChunkFactory(call.rid, call.created, call.model, call.include_usage)
        # completions' echo with logprobs: choices whose echo waits for the prompt's logprobs,
        # which come with the first delta (the echo then heads that delta's chunk, as vLLM's does)
        self.echo_due: set[int] = set()
        self.ids_started: set[int] = set()  # return_token_ids: choices whose prompt ids went out

    def _extras(self, chunk: dict[str, Any], state: ChoiceState) -> dict[str, Any]:
        """vLLM's additions to a choice's chunk (every chunk of a choice passes here). return_token_ids:
        each carries the ids received since the choice's last chunk; the prompt's ids go with the
        first chunk (chat: once; completions: per choice). continuous_usage_stats: the choice's usage so far."""
        if self.call.continuous_usage:
            prompt_tokens = self.usage.prompt_tokens.get(state.index // self.call.n, 0)
            chunk["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": state.completion_tokens,
                              "total_tokens": prompt_tokens + state.completion_tokens}
        if self.call.prompt_token_ids is None:
            return chunk
        choice = chunk["choices"][0]
        choice["token_ids"], state.unsent_ids = state.unsent_ids, []
        if state.index not in self.ids_started:
            prompt = self.call.prompt_token_ids[state.index // self.call.n]
            if not self.call.chat:
                choice["prompt_token_ids"] = prompt
            elif not self.ids_started:
                chunk["prompt_token_ids"] = prompt
            self.ids_started.add(state.index)
        return chunk

    async def opening(self, writer: SseWriter, choices: list[ChoiceState]) -> None:
        for state in choices:  # the opening chunk of each choice
            if self.call.chat:
                opening = self.chunks.chat(state.index, {"role": "assistant", "content": ""}, None, None)
                await writer.send(self._extras(opening, state))
                if self.call.echo_texts is not None:  # as vLLM: the echo is a delta of its own, before any token
                    echo = self.chunks.chat(state.index, {"content": self.call.echo_texts[0]}, None, None)
                    await writer.send(self._extras(echo, state))
            elif self.call.echo_texts is not None:
                text = self.call.echo_texts[state.index // self.call.n]
                state.text_offsets = TextOffsets(len(text))
                if self.call.logprobs:
                    self.echo_due.add(state.index)
                else:
                    await writer.send(self._extras(self.chunks.completion(state.index, text, None, None), state))

    async def delta(self, writer: SseWriter, state: ChoiceState, text: str, logprobs: Any,
                    finish_reason: str | None, events: list[Event] | None) -> None:
        if state.index in self.echo_due:
            self.echo_due.discard(state.index)
            text = self.call.echo_texts[state.index // self.call.n] + text
            logprobs = merge_completion_logprobs([part for part in (state.prompt_lp, logprobs) if part])
        if events is not None:
            await self._tool_deltas(writer, state, events, logprobs, finish_reason)
            return
        if not text and logprobs is None and not finish_reason:
            return  # nothing to tell the client (e.g. text held back for a stop string)
        if self.call.chat:
            body = {"content": text} if text or not finish_reason else {}
            await writer.send(self._extras(self.chunks.chat(state.index, body, logprobs, finish_reason), state))
        else:
            await writer.send(self._extras(self.chunks.completion(state.index, text, logprobs, finish_reason), state))

    async def _tool_deltas(self, writer: SseWriter, state: ChoiceState, events: list[Event], logprobs: Any,
                           finish_reason: str | None) -> None:
        deltas = _tool_deltas(events)
        if logprobs is not None and not deltas and not finish_reason:
            deltas = [{}]  # the logprobs of text the parser holds back still go out with this delta
        for i, body in enumerate(deltas):
            chunk = self.chunks.chat(state.index, body, logprobs if i == 0 else None, None)
            await writer.send(self._extras(chunk, state))
        if finish_reason:
            chunk = self.chunks.chat(state.index, {}, None if deltas else logprobs, state.finish_reason)
            await writer.send(self._extras(chunk, state))

    async def failed(self, writer: SseWriter, error: ApiError) -> None:
        await writer.send(error.body())
        await writer.done()

    async def closing(self, writer: SseWriter, choices: list[ChoiceState], usage: Usage) -> None:
        if self.call.include_usage:
            await writer.send(self.chunks.usage(self.call.object_name, usage.body(choices)))
        await writer.done()
