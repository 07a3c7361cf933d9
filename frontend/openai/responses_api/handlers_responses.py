"""POST /v1/responses, GET and DELETE /v1/responses/{response_id}: OpenAI's Responses API as a chat
call on the one generation path (the chat template, sampling, stop strings, grammars for
text.format and forced tools, cancellation when the client leaves, the server span and the
route's own request counter are those of every route), with the stored conversations that
`previous_response_id` continues (response_store.py)."""
from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from kvserve.frontend.http import GATEWAY, Gateway, read_json_body, request_key_id
from kvserve.frontend.openai.api_errors import ApiError
from kvserve.frontend.openai.generation import Call, annotate_call, collect, stream_call
from kvserve.frontend.openai.api_requests import ChatRequest
from kvserve.frontend.openai.handlers_openai import chat_request_ids, prepare_chat, subrequests
from kvserve.frontend.openai.responses_api.response_events import ResponseEvents
from kvserve.frontend.openai.responses_api.response_object import (ResponseMeta, items_as_messages, new_id,
                                                                   output_items, response_status, usage_body)
from kvserve.frontend.openai.responses_api.response_store import RESPONSE_STORE, ResponseStore
from kvserve.frontend.openai.responses_api.responses_request import parse_responses_request


def _owner() -> str:
    """Whose responses these are: the presented API key (its digest), "" when the server has none."""
    return request_key_id() or ""


def _not_found() -> ApiError:
    return ApiError(404, "no stored response has this id", param="response_id", code="response_not_found")


async def create_response(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    store: ResponseStore = request.app[RESPONSE_STORE]
    owner = _owner()
    body = await read_json_body(request, gateway.config.max_request_body_bytes, gateway.config.body_timeout)

    def history(response_id: str) -> list[dict[str, Any]] | None:
        entry = store.get(owner, response_id)
        return None if entry is None else entry.conversation

    req = parse_responses_request(body, gateway.vocab_size, gateway.config.tools, history)
    chat = req.chat
    ids = None
    if req.echo.get("truncation") == "auto":
        chat.messages, ids = await _fitting_messages(gateway, chat)
    model, ids = await prepare_chat(gateway, chat, param="input", ids=ids)
    meta = ResponseMeta(new_id("resp"), int(time.time()), model, req.echo, store=req.store and store.enabled)
    call = Call(meta.id, meta.created_at, model, 1, chat=True, logprobs=chat.logprobs, include_usage=False,
                constraint_param=chat.constraint_param, tools=chat.tools, input_param="input")
    subs = subrequests(request, meta.id, [ids], chat.sampling, req.stream, gateway.lora_of(model))
    annotate_call(call, subs)

    def keep(response: dict[str, Any], items: list[dict[str, Any]]) -> None:
        if meta.store:
            store.put(owner, response, req.input_messages + items_as_messages(items))

    if req.stream:
        return await stream_call(request, gateway, call, subs, ResponseEvents(meta, keep))
    choices, usage = await collect(gateway, call, subs)
    items = output_items(choices[0])
    status, incomplete = response_status(choices[0])
    response = meta.body(status, items, usage_body(usage, choices), incomplete=incomplete)
    keep(response, items)
    return web.json_response(response)


async def _fitting_messages(gateway: Gateway, chat: ChatRequest) -> tuple[list[dict[str, Any]], list[int] | None]:
    """truncation "auto": the conversation without as few of its oldest items as make it fit beside
    max_output_tokens (system messages and the last item stay; what is stored keeps them all), and
    its token ids, which the call then uses rather than render it again (None: not rendered here).
    The number to drop is found by bisection over renders, so a long conversation costs a few
    renders. A cut never leaves a tool result whose call it dropped: the model would see an answer
    to a question it never asked, and templates that pair them refuse it. When nothing fits, it is
    left whole and the context check refuses it as ever."""
    limit = gateway.config.max_model_len
    messages = chat.messages
    droppable = [i for i, m in enumerate(messages[:-1]) if m["role"] != "system"]
    first_kept = droppable[1:] + [len(messages) - 1]  # first_kept[k - 1]: the oldest item a cut of k keeps
    cuts = [k for k in range(1, len(droppable) + 1) if messages[first_kept[k - 1]]["role"] != "tool"]
    if limit is None or not cuts:
        return messages, None
    room = limit - chat.sampling.get("max_tokens", 1)
    fitting: dict[int, tuple[list[dict[str, Any]], list[int]]] = {}  # cut -> (what is left, its ids)

    async def fits(k: int) -> bool:
        gone = set(droppable[:k])
        kept = [m for i, m in enumerate(messages) if i not in gone]
        try:
            ids = await chat_request_ids(gateway, chat, "input", kept)
        except ApiError:  # a template that refuses what is left (roles out of turn): not this cut
            return False
        if len(ids) > room:
            return False
        fitting[k] = kept, ids
        return True

    if await fits(0):
        return fitting[0]
    low, high = 0, len(cuts) - 1  # bisection over the allowed cuts, fewest dropped first
    if not await fits(cuts[high]):
        return messages, None
    while low < high:
        mid = (low + high) // 2
        if await fits(cuts[mid]):
            high = mid
        else:
            low = mid + 1
    return fitting[cuts[low]]


async def get_response(request: web.Request) -> web.Response:
    if request.query.get("stream") not in (None, "false"):
        raise ApiError(400, "streaming a stored response again is not supported by this server", param="stream",
                       code="unsupported_parameter")
    entry = request.app[RESPONSE_STORE].get(_owner(), request.match_info["response_id"])
    if entry is None:
        raise _not_found()
    return web.json_response(entry.body)


async def delete_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    if not request.app[RESPONSE_STORE].delete(_owner(), response_id):
        raise _not_found()
    return web.json_response({"id": response_id, "object": "response", "deleted": True})
