"""POST /v1/messages: Anthropic's Messages API, as a chat call on the one generation path (the chat
template, sampling, stop strings, grammars for forced tools, cancellation when the client leaves,
the server span and the route's own request counter are those of every route); and
POST /v1/messages/count_tokens, the same conversation rendered and counted, not run."""
from __future__ import annotations

import time
import uuid

from aiohttp import web

from kvserve.frontend.http import GATEWAY, read_json_body
from kvserve.frontend.openai.anthropic.messages_body import message_body
from kvserve.frontend.openai.anthropic.messages_request import parse_messages_request
from kvserve.frontend.openai.anthropic.messages_stream import MessagesStream
from kvserve.frontend.openai.generation import Call, annotate_call, collect, stream_call
from kvserve.frontend.openai.handlers_openai import chat_request_ids, prepare_chat, subrequests


async def create_message(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    body = await read_json_body(request, gateway.config.max_request_body_bytes, gateway.config.body_timeout)
    req = parse_messages_request(body, gateway.vocab_size, gateway.config.tools)
    chat = req.chat
    model, ids = await prepare_chat(gateway, chat)
    rid = f"msg_{uuid.uuid4().hex}"
    call = Call(rid, int(time.time()), model, 1, chat=True, logprobs=False, include_usage=False,
                constraint_param=chat.constraint_param, tools=chat.tools)
    subs = subrequests(request, rid, [ids], chat.sampling, req.stream, gateway.lora_of(model))
    annotate_call(call, subs)
    if req.stream:
        return await stream_call(request, gateway, call, subs, MessagesStream(rid, model, len(ids), req.stop_sequences))
    choices, usage = await collect(gateway, call, subs)
    return web.json_response(message_body(rid, model, choices, usage, req.stop_sequences))


async def count_message_tokens(request: web.Request) -> web.Response:
    """The prompt's tokens as /v1/messages would send them (Anthropic's count_tokens: no max_tokens)."""
    gateway = request.app[GATEWAY]
    body = await read_json_body(request, gateway.config.max_request_body_bytes, gateway.config.body_timeout)
    req = parse_messages_request({**body, "max_tokens": 1 if body.get("max_tokens") is None else body["max_tokens"]}, gateway.vocab_size,
                                 gateway.config.tools)
    await gateway.resolve_known_model(req.chat.model)
    ids = await chat_request_ids(gateway, req.chat)  # as the message would render it, a prefill left open
    return web.json_response({"input_tokens": len(ids)})
