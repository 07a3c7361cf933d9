"""The score and rerank schemas for /openapi.json (openapi.py mounts them), with the bounds
score_request.py checks."""
from __future__ import annotations

from typing import Any

from kvserve.seam.limits import MAX_EMBEDDING_INPUTS

SCORE_PATHS = ("/score", "/v1/score")
RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")


def score_schemas() -> dict[str, Any]:
    text = {"type": "string", "minLength": 1}
    texts = {"oneOf": [text, {"type": "array", "minItems": 1, "maxItems": MAX_EMBEDDING_INPUTS, "items": text}]}
    truncate = {"type": "integer", "minimum": -1,
                "description": "keep each text's first N tokens (-1: the model's limit); 0 is refused"}
    model = {"type": "string", "maxLength": 512, "nullable": True}
    usage = {"type": "object", "required": ["total_tokens"], "properties": {
        "prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer"}}}
    return {
        "ScoreRequest": {"type": "object", "required": ["text_1", "text_2"], "properties": {
            "model": model, "text_1": texts, "text_2": texts, "truncate_prompt_tokens": truncate},
            "description": "pairs 1:N (text_1 one text) or N:N; a pair scores the cosine of its embeddings"},
        "ScoreList": {"type": "object", "required": ["id", "object", "data", "model", "usage"], "properties": {
            "id": {"type": "string"}, "object": {"type": "string", "enum": ["list"]}, "created": {"type": "integer"},
            "model": {"type": "string"}, "usage": usage,
            "data": {"type": "array", "items": {"type": "object", "required": ["index", "object", "score"], "properties": {
                "index": {"type": "integer"}, "object": {"type": "string", "enum": ["score"]},
                "score": {"type": "number"}}}}}},
        "RerankRequest": {"type": "object", "required": ["query", "documents"], "properties": {
            "model": model, "query": text, "truncate_prompt_tokens": truncate,
            "documents": {"type": "array", "minItems": 1, "maxItems": MAX_EMBEDDING_INPUTS, "items": text},
            "top_n": {"type": "integer", "minimum": 0, "description": "the best N documents (0: all)"},
            "return_documents": {"type": "boolean", "nullable": True, "description": "default true"}}},
        "RerankResponse": {"type": "object", "required": ["id", "model", "usage", "results"], "properties": {
            "id": {"type": "string"}, "model": {"type": "string"}, "usage": usage,
            "results": {"type": "array", "items": {"type": "object", "required": ["index", "relevance_score"], "properties": {
                "index": {"type": "integer"}, "relevance_score": {"type": "number"},
                "document": {"type": "object", "properties": {"text": {"type": "string"}}}}}}}},
    }
