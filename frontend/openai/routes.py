"""The gateway's routes and the handlers that answer them, in one table the app mounts."""
from __future__ import annotations

from aiohttp import web

from kvserve.frontend.http import GATEWAY
from kvserve.frontend.openai import handlers_misc as misc
from kvserve.frontend.openai.anthropic.handlers_messages import count_message_tokens, create_message
from kvserve.frontend.openai.handlers_embeddings import create_embeddings
from kvserve.frontend.openai.handlers_lora import add_lora_routes
from kvserve.frontend.openai.handlers_openai import create_chat_completion, create_completion
from kvserve.frontend.openai.responses_api.handlers_responses import (create_response, delete_response,
                                                                      get_response)
from kvserve.frontend.openai.responses_api.response_store import RESPONSE_STORE, ResponseStore
from kvserve.frontend.openai.scoring.handlers_score import create_rerank, create_score
from kvserve.frontend.openai.scoring.score_openapi import RERANK_PATHS, SCORE_PATHS


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/completions", create_completion)
    app.router.add_post("/v1/chat/completions", create_chat_completion)
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{response_id}", get_response, allow_head=False)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app[RESPONSE_STORE] = ResponseStore(app[GATEWAY].config.response_store_entries)
    app.router.add_post("/v1/messages", create_message)
    app.router.add_post("/v1/messages/count_tokens", count_message_tokens)
    app.router.add_post("/v1/embeddings", create_embeddings)
    for path in SCORE_PATHS:
        app.router.add_post(path, create_score)
    for path in RERANK_PATHS:
        app.router.add_post(path, create_rerank)
    app.router.add_get("/v1/models", misc.list_models, allow_head=False)
    app.router.add_get("/v1/models/{model}", misc.get_model, allow_head=False)
    app.router.add_get("/health", misc.health, allow_head=False)
    app.router.add_get("/metrics", misc.metrics, allow_head=False)
    app.router.add_get("/version", misc.version, allow_head=False)
    app.router.add_get("/openapi.json", misc.openapi, allow_head=False)
    app.router.add_post("/tokenize", misc.tokenize)
    app.router.add_post("/detokenize", misc.detokenize)
    if app[GATEWAY].config.server_dev_mode:
        app.router.add_post("/reset_prefix_cache", misc.reset_prefix_cache)
    if app[GATEWAY].config.allow_runtime_lora_updating:
        add_lora_routes(app)

