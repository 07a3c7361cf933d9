"""The bodies of /score and /rerank as vLLM takes them, checked field by field.

/score pairs `text_1` with `text_2`: a string or a one-item list against N texts (1:N), or two
lists of one length (N:N). /rerank scores one `query` against `documents` and returns the best
`top_n` (0: all). Both take `truncate_prompt_tokens`; every text must be non-empty, since an empty
one has no token to pool.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvserve.frontend.openai import fields as F
from kvserve.frontend.openai.api_errors import bad_request
from kvserve.frontend.openai.handlers_embeddings import truncation
from kvserve.seam.limits import MAX_EMBEDDING_INPUTS


@dataclass(slots=True)
class ScorePairs:
    model: str | None
    texts: list[str]  # every distinct text once: what is embedded
    pairs: list[tuple[int, int]]  # (left, right) indexes into `texts`, in the response's order
    pooling: dict[str, Any]


@dataclass(slots=True)
class RerankRequest:
    scoring: ScorePairs  # pair i is (query, documents[i])
    documents: list[str]
    top_n: int  # 0: every document
    return_documents: bool


def _texts(value: Any, name: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request(f"'{name}' must be a string or a list of strings", param=name)
    if not value:
        raise bad_request(f"'{name}' must not be empty", param=name)
    if len(value) > MAX_EMBEDDING_INPUTS:
        raise bad_request(f"'{name}' has more than {MAX_EMBEDDING_INPUTS} entries", param=name)
    if any(not v for v in value):
        raise bad_request(f"'{name}' must not hold an empty string", param=name)
    return value


def _pairs(model: str | None, left: list[str], right: list[str], pooling: dict[str, Any]) -> ScorePairs:
    """Pairs over the distinct texts: a text repeated (the query of 1:N) is embedded once."""
    if len(left) == 1:
        left = left * len(right)
    index: dict[str, int] = {}
    for text in (*left, *right):
        index.setdefault(text, len(index))
    if len(index) > MAX_EMBEDDING_INPUTS:
        raise bad_request(f"the request holds more than {MAX_EMBEDDING_INPUTS} distinct texts")
    return ScorePairs(model, list(index), [(index[a], index[b]) for a, b in zip(left, right)], pooling)


def parse_score(body: dict[str, Any]) -> ScorePairs:
    model = F.opt_str(body, "model", max_len=512)
    left, right = _texts(body.get("text_1"), "text_1"), _texts(body.get("text_2"), "text_2")
    if len(left) != 1 and len(left) != len(right):
        raise bad_request("'text_1' and 'text_2' must pair 1:1, 1:N or N:N (text_1 holds one text, or as "
                          "many as text_2)", param="text_1")
    return _pairs(model, left, right, truncation(body))


def parse_rerank(body: dict[str, Any]) -> RerankRequest:
    model = F.opt_str(body, "model", max_len=512)
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise bad_request("'query' must be a non-empty string", param="query")
    documents = body.get("documents")
    if not isinstance(documents, list):
        raise bad_request("'documents' must be a list of strings", param="documents")
    documents = _texts(documents, "documents")
    top_n = F.opt_int(body, "top_n", 0)
    return_documents = F.opt_bool(body, "return_documents")
    return RerankRequest(_pairs(model, [query], documents, truncation(body)), documents, top_n or 0,
                         True if return_documents is None else return_documents)
