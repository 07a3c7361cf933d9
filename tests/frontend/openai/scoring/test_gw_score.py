"""/score and /rerank: request validation and pairing (pure), the cosine of the vectors, and the
routes on a gateway without an embedding model. The routes on a real embedding model are in
tests/backend/embed/test_embed_serve.py."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

from kvserve.frontend.backend_client import EmbedResult
from kvserve.frontend.openai.api_errors import ApiError
from kvserve.frontend.openai.scoring.handlers_score import cosine_scores
from kvserve.frontend.openai.scoring.score_request import parse_rerank, parse_score


def _pairs(req) -> list[tuple[str, str]]:
    return [(req.texts[a], req.texts[b]) for a, b in req.pairs]


def test_score_pairs_one_to_one_one_to_many_and_many_to_many():
    assert _pairs(parse_score({"text_1": "q", "text_2": "d"})) == [("q", "d")]
    one_to_n = parse_score({"text_1": "q", "text_2": ["a", "b", "q"]})
    assert _pairs(one_to_n) == [("q", "a"), ("q", "b"), ("q", "q")]
    assert one_to_n.texts == ["q", "a", "b"]  # each distinct text is embedded once
    assert _pairs(parse_score({"text_1": ["q"], "text_2": ["a", "b"]})) == [("q", "a"), ("q", "b")]
    assert _pairs(parse_score({"text_1": ["x", "y"], "text_2": ["a", "b"]})) == [("x", "a"), ("y", "b")]
    assert parse_score({"text_1": "q", "text_2": "d", "truncate_prompt_tokens": -1}).pooling == \
        {"truncate_prompt_tokens": -1}


@pytest.mark.parametrize("body, param", [
    ({"text_2": "d"}, "text_1"), ({"text_1": "q"}, "text_2"), ({"text_1": "", "text_2": "d"}, "text_1"),
    ({"text_1": [], "text_2": "d"}, "text_1"), ({"text_1": "q", "text_2": ["a", 1]}, "text_2"),
    ({"text_1": "q", "text_2": ["a", ""]}, "text_2"), ({"text_1": ["x", "y"], "text_2": ["a", "b", "c"]}, "text_1"),
    ({"text_1": "q", "text_2": ["a"] * 2049}, "text_2"), ({"text_1": {"t": 1}, "text_2": "d"}, "text_1"),
    ({"text_1": "q", "text_2": "d", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"text_1": "q", "text_2": "d", "model": 3}, "model"),
])
def test_bad_score_bodies_name_the_field(body, param):
    with pytest.raises(ApiError) as info:
        parse_score(body)
    assert info.value.status == 400 and info.value.param == param


def test_too_many_distinct_texts_is_refused():
    with pytest.raises(ApiError) as info:
        parse_score({"text_1": [f"q{i}" for i in range(2000)], "text_2": [f"d{i}" for i in range(2000)]})
    assert info.value.status == 400 and "distinct texts" in info.value.message


def test_rerank_pairs_the_query_with_each_document():
    req = parse_rerank({"query": "q", "documents": ["a", "b"], "top_n": 1, "return_documents": False})
    assert _pairs(req.scoring) == [("q", "a"), ("q", "b")]
    assert (req.documents, req.top_n, req.return_documents) == (["a", "b"], 1, False)
    assert parse_rerank({"query": "q", "documents": ["a"]}).top_n == 0  # all, as vLLM's default


@pytest.mark.parametrize("body, param", [
    ({"documents": ["a"]}, "query"), ({"query": "", "documents": ["a"]}, "query"), ({"query": ["q"], "documents": ["a"]}, "query"),
    ({"query": "q"}, "documents"), ({"query": "q", "documents": "a"}, "documents"), ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": [{"text": "a"}]}, "documents"), ({"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, "return_documents"),
])
def test_bad_rerank_bodies_name_the_field(body, param):
    with pytest.raises(ApiError) as info:
        parse_rerank(body)
    assert info.value.status == 400 and info.value.param == param


def test_cosine_of_each_pair():
    vectors = np.array([[3, 4, 0], [6, 8, 0], [0, 0, 2], [-3, -4, 0], [0, 0, 0]], dtype="<f4")
    result = EmbedResult([v.tobytes() for v in vectors], [1] * len(vectors))
    scores = cosine_scores(result, [(0, 1), (0, 2), (0, 3), (0, 4), (2, 2)])
    assert scores == pytest.approx([1.0, 0.0, -1.0, 0.0, 1.0], abs=1e-12)  # a zero vector scores 0, not NaN


@pytest.mark.parametrize("path, body", [("/v1/score", {"text_1": "a", "text_2": "b"}),
                                        ("/score", {"text_1": "a", "text_2": "b"}),
                                        ("/v1/rerank", {"query": "a", "documents": ["b"]}),
                                        ("/v2/rerank", {"query": "a", "documents": ["b"]}),
                                        ("/rerank", {"query": "a", "documents": ["b"]})])
def test_without_an_embedding_model_the_routes_are_400(server, path, body):
    req = urllib.request.Request(f"{server.url}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=10)
    assert info.value.code == 400
    assert json.loads(info.value.read())["error"]["code"] == "model_not_supported"
