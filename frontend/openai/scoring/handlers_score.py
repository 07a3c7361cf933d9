"""POST /score and /rerank: embed every distinct text in one request to the embed model, then
score each pair by the cosine of its vectors (in float64, so a pair of equal texts scores 1)."""
from __future__ import annotations

import time
import uuid

import numpy as np
from aiohttp import web

from kvserve.frontend.backend_client import EmbedResult
from kvserve.frontend.http import GATEWAY, Gateway, read_json_body, response_id
from kvserve.frontend.openai.api_errors import ApiError
from kvserve.frontend.openai.handlers_embeddings import embed, embedding_model_for
from kvserve.frontend.openai.scoring.score_request import ScorePairs, parse_rerank, parse_score

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


async def create_score(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    req = parse_score(await read_json_body(request, gateway.config.max_request_body_bytes))
    rid = f"score-{uuid.uuid4().hex}"
    model, scores, tokens = await _score(gateway, rid, req, request.path)
    return web.json_response({
        "id": response_id("score", rid), "object": "list", "created": int(time.time()), "model": model,
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    })


async def create_rerank(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    req = parse_rerank(await read_json_body(request, gateway.config.max_request_body_bytes))
    rid = f"rerank-{uuid.uuid4().hex}"
    model, scores, tokens = await _score(gateway, rid, req.scoring, request.path)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: equal scores keep their order
    results = []
    for i in order[:req.top_n or None]:
        result: dict = {"index": i, "relevance_score": scores[i]}
        if req.return_documents:
            result["document"] = {"text": req.documents[i]}
        results.append(result)
    return web.json_response({"id": response_id("rerank", rid), "model": model, "usage": {"total_tokens": tokens},
                              "results": results})


async def _score(gateway: Gateway, rid: str, req: ScorePairs, route: str) -> tuple[str, list[float], int]:
    model = await embedding_model_for(gateway, req.model, route)
    try:
        result = await embed(gateway, rid, model, req.texts, req.pooling, "input")
    except ApiError as exc:
        if exc.code != CONTEXT_LENGTH_EXCEEDED:
            raise
        # the model counts its inputs over the distinct texts, which the client never sees
        raise ApiError(400, "a text has more tokens than the embedding model takes; set truncate_prompt_tokens "
                            "(-1: cut each text to the model's limit)", param="truncate_prompt_tokens",
                       code=CONTEXT_LENGTH_EXCEEDED) from None
    return model, cosine_scores(result, req.pairs), sum(result.prompt_tokens)


def cosine_scores(result: EmbedResult, pairs: list[tuple[int, int]]) -> list[float]:
    vectors = np.stack([np.frombuffer(v, dtype="<f4") for v in result.vectors]).astype(np.float64)
    norms = np.linalg.norm(vectors, axis=1)
    norms[norms == 0] = 1.0  # a zero vector scores 0 with everything, never NaN
    unit = vectors / norms[:, None]
    left, right = (np.array(side, dtype=np.int64) for side in zip(*pairs))
    return np.einsum("ij,ij->i", unit[left], unit[right]).tolist()
