"""POST /v1/embeddings (OpenAI's, with vLLM's `truncate_prompt_tokens` and
`normalize`): validate, send every input in one request to the embed model,
render its float32 vectors as JSON numbers or base64.

The gateway has no tokenizer of the embedding model: texts are tokenized (and
checked against its 512-token limit) by the model, which names the field in
its error; token-id inputs are checked for shape here and for range there.
"""
from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import web

from kvserve.frontend.backend_client import (BackendError, EmbedRequest, EmbedResult, annotate_embeddings,
                                             backend_traceparent)
from kvserve.frontend.http import GATEWAY, Gateway, read_json_body, request_span, response_id
from kvserve.frontend.openai import fields as F
from kvserve.frontend.openai.api_errors import ApiError, bad_request, from_backend, model_not_found
from kvserve.seam.limits import MAX_EMBEDDING_INPUTS



ENCODING_FORMATS = ("float", "base64")


@dataclass(slots=True)
class EmbeddingsRequest:
    model: str | None
    inputs: list[str] | list[list[int]]
    encoding_format: str
    pooling: dict[str, Any]
    user: str | None
    request_id: str | None = None  # vLLM's: the response's id (after "embd-") unless X-Request-Id names one


def _inputs(value: Any) -> list[str] | list[list[int]]:
    """A string, a list of strings, a list of token ids, or a list of lists of them."""
    if value is None:
        raise bad_request("'input' is required", param="input")
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(F.is_int(t) for t in value):
        value = [value]
    if not isinstance(value, list):
        raise bad_request("'input' must be a string, a list of strings, a list of token ids or a list of "
                          "lists of token ids", param="input")
    if not value:
        raise bad_request("'input' must not be empty", param="input")
    if len(value) > MAX_EMBEDDING_INPUTS:
        raise bad_request(f"'input' has more than {MAX_EMBEDDING_INPUTS} entries", param="input")
    if all(isinstance(v, str) for v in value):
        if any(not v for v in value):
            raise bad_request("'input' must not hold an empty string", param="input")
        return value
    if all(isinstance(v, list) for v in value):
        for ids in value:
            F.token_ids(ids, "input", None)
        return value
    raise bad_request("'input' must not mix strings and token ids", param="input")


def parse_embeddings(body: dict[str, Any]) -> EmbeddingsRequest:
    model = F.opt_str(body, "model", max_len=512)
    inputs = _inputs(body.get("input"))
    encoding = F.opt_str(body, "encoding_format", max_len=16) or "float"
    if encoding not in ENCODING_FORMATS:
        raise bad_request("'encoding_format' must be 'float' or 'base64'", param="encoding_format")
    pooling: dict[str, Any] = {}
    dimensions = F.opt_int(body, "dimensions", 1)
    if dimensions is not None:
        pooling["dimensions"] = dimensions
    pooling.update(truncation(body))
    normalize = F.opt_bool(body, "normalize")
    if normalize is not None:
        pooling["normalize"] = normalize
    user = F.opt_str(body, "user", max_len=256)
    request_id = F.opt_str(body, "request_id", max_len=256, allow_empty=False)
    return EmbeddingsRequest(model, inputs, encoding, pooling, user, request_id)


def truncation(body: dict[str, Any]) -> dict[str, int]:
    """vLLM's `truncate_prompt_tokens` as the embed model's pooling option ({} when not set)."""
    truncate = F.opt_prompt_truncation(body, "the model's limit")
    return {} if truncate is None else {"truncate_prompt_tokens": truncate}


async def embedding_model_for(gateway: Gateway, name: str | None, route: str) -> str:
    """The embedding model that answers `route` for the request's `model`, ready to embed."""
    if (name is not None and name not in gateway.config.embedding_model_names
            and await gateway.lora_adapter(name) is not None):
        raise ApiError(400, f"the requested model is a LoRA adapter: adapters serve generation only, not {route}",
                       param="model", code="model_not_supported")
    model = _embedding_model(gateway, name, route)
    await gateway.ensure_embedder_ready()
    return model


async def embed(gateway: Gateway, rid: str, model: str, inputs: list[str] | list[list[int]],
                pooling: dict[str, Any], prompt_param: str) -> EmbedResult:
    """One backend request for every input, annotated on the request's span; errors as the API's."""
    span = request_span()
    annotate_embeddings(span, response_id=rid, model=model, num_inputs=len(inputs))
    assert gateway.embedder is not None
    try:
        result = await gateway.embedder.embed(EmbedRequest(rid, inputs, pooling, backend_traceparent(span)))
    except BackendError as exc:
        raise from_backend(exc, prompt_param=prompt_param) from None
    if len(result.vectors) != len(inputs):
        raise from_backend(RuntimeError("embedding count mismatch"), prompt_param=prompt_param)
    annotate_embeddings(span, response_id=rid, model=model, num_inputs=len(inputs),
                        input_tokens=sum(result.prompt_tokens))
    return result


def _embedding_model(gateway: Gateway, name: str | None, route: str) -> str:
    names = gateway.config.embedding_model_names
    if name is not None and name in gateway.config.served_model_names:
        raise ApiError(400, f"the requested model is a generative model; {route} needs an embedding model "
                            "(GET /v1/models lists them)", param="model", code="model_not_supported")
    if not names or gateway.embedder is None:
        raise ApiError(400, "this server serves no embedding model (start it with --embedding-model)",
                       param="model", code="model_not_supported")
    if name is None:
        return names[0]
    if name not in names:
        raise model_not_found()
    return name


def _render(vector: bytes, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector).decode("ascii")  # little-endian float32, as OpenAI's client decodes
    return np.frombuffer(vector, dtype="<f4").tolist()


async def create_embeddings(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = await read_json_body(request, gateway.config.max_request_body_bytes)
    req = parse_embeddings(body)
    model = await embedding_model_for(gateway, req.model, "/v1/embeddings")
    rid = f"embd-{uuid.uuid4().hex}"
    result = await embed(gateway, rid, model, req.inputs, req.pooling, "input")
    tokens = sum(result.prompt_tokens)
    return web.json_response({
        "id": response_id("embd", rid, req.request_id),
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [{"object": "embedding", "index": i, "embedding": _render(v, req.encoding_format)}
                 for i, v in enumerate(result.vectors)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
