"""The routes around generation: /v1/models, /health, /metrics, /version,
/tokenize, /detokenize, /openapi.json, and /reset_prefix_cache (--server-dev-mode)."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from kvserve.frontend.backend_client import BackendError, EngineControl, LoRAAdapterInfo
from kvserve.frontend.http import GATEWAY, Gateway, read_json_body
from kvserve.frontend.openai import fields as F
from kvserve.frontend.openai.api_errors import (ApiError, backend_unavailable, bad_request, from_backend,
                                               model_not_found, shutting_down)
from kvserve.frontend.openai.api_requests import check_continuable, parse_messages, template_kwargs
from kvserve.frontend.openai.handlers_openai import chat_prompt_ids
from kvserve.frontend.openai.openapi import openapi_document

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
log = logging.getLogger("kvserve.frontend")


def _replicas(gateway: Gateway) -> dict[str, int] | None:
    """Ready and total replicas when the backend balances several (ReplicaSet)."""
    status = getattr(gateway.backend, "replica_status", None)
    if status is None:
        return None
    replicas = status()
    return {"ready": sum(r.ready for r in replicas), "total": len(replicas)}


def _adapter_card(gateway: Gateway, adapter: LoRAAdapterInfo) -> dict[str, Any]:
    """A LoRA adapter as vLLM lists it: its name, the base model as `parent`, its folder as `root`."""
    return {**_model_card(gateway, gateway.default_model), "id": adapter.name, "root": adapter.path,
            "parent": adapter.parent or gateway.default_model}


def _model_card(gateway: Gateway, name: str) -> dict[str, Any]:
    cfg = gateway.config
    embedding = name in cfg.embedding_model_names and name not in cfg.served_model_names
    card = {
        "id": name,
        "object": "model",
        "created": gateway.created,
        "owned_by": "kvserve",
        "root": (cfg.embedding_model_root if embedding else cfg.model_root) or name,
        "parent": None,
        "max_model_len": cfg.embedding_max_model_len if embedding else cfg.max_model_len,
    }
    replicas = None if embedding else _replicas(gateway)
    if replicas is not None:
        card["replicas"] = replicas
    return card


async def list_models(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    await gateway.learn_model_facts_if_ready()
    names = [*gateway.config.served_model_names, *gateway.config.embedding_model_names]
    cards = [_model_card(gateway, n) for n in names]
    cards += [_adapter_card(gateway, a) for a in await gateway.lora_adapters() if a.name not in names]
    return web.json_response({"object": "list", "data": cards})


async def get_model(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    await gateway.learn_model_facts_if_ready()
    name = request.match_info["model"]
    if name not in gateway.config.embedding_model_names:
        name = gateway.resolve_model(name)
        if gateway.lora_of(name) is not None:
            adapter = await gateway.lora_adapter(name)
            if adapter is None:
                raise model_not_found()
            return web.json_response(_adapter_card(gateway, adapter))
    return web.json_response(_model_card(gateway, name))


async def health(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    if gateway.draining:  # SIGTERM: out of the load balancer at once, while in-flight requests finish
        raise shutting_down()
    # Always a fresh probe: load balancers act on this answer.
    if not await gateway.backend.ready():
        raise backend_unavailable()
    if gateway.embedder is not None and not await gateway.embedder.ready():
        raise backend_unavailable("the embedding model is not ready")
    replicas = _replicas(gateway)  # several: 200 while at least one is ready
    return web.json_response({"status": "ok"} if replicas is None else {"status": "ok", "replicas": replicas})


async def metrics(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    try:
        backend_text = await asyncio.wait_for(gateway.backend.metrics_text(), 5.0)
    except asyncio.TimeoutError:
        backend_text = "# backend metrics timed out\n"
    text = gateway.metrics.render().decode("utf-8")
    if backend_text:
        text = text + ("" if text.endswith("\n") else "\n") + backend_text
    return web.Response(body=text.encode("utf-8"), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    """vLLM's dev-mode route: every engine forgets its cached prefixes, so the next requests
    compute theirs afresh (a benchmark's cold run; new weights). Requests running now go on.
    vLLM's answer: 200 with no body."""
    gateway = request.app[GATEWAY]
    await gateway.ensure_ready()
    if not isinstance(gateway.backend, EngineControl):
        raise ApiError(400, "this server's backend cannot reset its prefix cache", code="not_supported")
    try:
        answer = await gateway.backend.engine_control("reset_prefix_cache")
    except BackendError as exc:
        raise from_backend(exc, prompt_param="reset_prefix_cache") from None
    log.info("prefix cache reset: %s cached blocks forgotten", answer.get("forgotten_blocks"))
    return web.Response(status=200)


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": request.app[GATEWAY].config.version})


async def tokenize(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = await read_json_body(request, gateway.config.max_request_body_bytes, gateway.config.body_timeout)
    await gateway.resolve_known_model(F.opt_str(body, "model", max_len=512))
    tok = gateway.require_tokenizer()
    add_special = F.opt_bool(body, "add_special_tokens")
    add_gen = F.opt_bool(body, "add_generation_prompt")
    token_strs = F.opt_bool(body, "return_token_strs")
    prompt = F.opt_str(body, "prompt", max_len=gateway.config.max_request_body_bytes)
    if body.get("messages") is not None:
        messages = parse_messages(body["messages"])
        continue_final = bool(F.opt_bool(body, "continue_final_message"))
        if continue_final:
            check_continuable(messages, add_gen)
        ids = await chat_prompt_ids(gateway, messages, not continue_final if add_gen is None else add_gen,
                                    continue_final_message=continue_final, template_kwargs=template_kwargs(body),
                                    add_special_tokens=bool(add_special))  # a chat's default: False
    elif prompt is not None:
        ids = await tok.encode_async(prompt, add_special_tokens=True if add_special is None else add_special)
    else:
        raise bad_request("'prompt' or 'messages' is required", param="prompt")
    out: dict[str, Any] = {"count": len(ids), "max_model_len": gateway.config.max_model_len, "tokens": ids}
    if token_strs:
        out["token_strs"] = tok.token_strings(ids)
    return web.json_response(out)


async def detokenize(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = await read_json_body(request, gateway.config.max_request_body_bytes, gateway.config.body_timeout)
    await gateway.resolve_known_model(F.opt_str(body, "model", max_len=512))
    tok = gateway.require_tokenizer()
    if body.get("tokens") is None:
        raise bad_request("'tokens' is required", param="tokens")
    ids = F.token_ids(body["tokens"], "tokens", tok.vocab_size, allow_empty=True)
    return web.json_response({"prompt": tok.decode(ids, skip_special_tokens=False)})


async def openapi(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    return web.json_response(openapi_document(gateway.config.version, secured=bool(gateway.key_digests), vocab_size=gateway.vocab_size))
