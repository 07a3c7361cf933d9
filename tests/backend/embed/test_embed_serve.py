"""/v1/embeddings end to end: `kvserve serve --embedding-model` (the gateway, the
embedded host with the llm and embed models), driven by the official openai
client; vectors compared with sentence-transformers on the same folder."""
from __future__ import annotations

import base64
import concurrent.futures
import json
import re
import urllib.error
import urllib.request

import numpy as np
import pytest

from tests.backend.embed.embed_fixtures import MAX_TOKENS, minilm_dir, parity_texts
from tests.serve_process import kvserve_serve

openai = pytest.importorskip("openai")
API_KEY = "sk-embed"
CHAT = "tiny-llama"
EMBED = "minilm"
MIN_COSINE = 0.99999


class Served:
    def __init__(self, url: str) -> None:
        self.url = url

    def client(self):
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:
            return resp.read().decode()

    def metric(self, name: str, labels: str = "") -> float:
        pattern = rf"^{re.escape(name)}\{{[^}}]*{re.escape(labels)}[^}}]*\}} (\S+)$"
        return sum(float(m.group(1)) for m in re.finditer(pattern, self.metrics(), re.M))


@pytest.fixture(scope="module")
def model_dir() -> str:
    return minilm_dir()


@pytest.fixture(scope="module")
def served(llama_dir: str, model_dir: str):
    args = ["--model", llama_dir, "--port", "0", "--served-model-name", CHAT, "--embedding-model", model_dir,
            "--embedding-served-model-name", EMBED, "--api-key", API_KEY, "--max-num-seqs", "16",
            "--num-kv-blocks", "512", "--log-format", "console"]
    with kvserve_serve(args, timeout_s=300, check_exit=False) as (_, line):
        yield Served(line.split()[3])


@pytest.fixture(scope="module")
def st_model(model_dir):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(model_dir, device="cpu")
    assert model.max_seq_length == MAX_TOKENS  # the folder's own limit, which kvserve takes too
    return model


@pytest.fixture(scope="module")
def texts(st_model) -> list[str]:
    return parity_texts(lambda t: len(st_model.tokenizer(t)["input_ids"]))


@pytest.fixture(scope="module")
def reference(st_model, texts) -> np.ndarray:
    return st_model.encode(texts, batch_size=8, convert_to_numpy=True)


def _cosines(ours, ref) -> np.ndarray:
    ours, ref = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))


def _vectors(response) -> np.ndarray:
    assert [d.index for d in response.data] == list(range(len(response.data)))
    return np.array([d.embedding for d in response.data])


def test_models_lists_both(served, model_dir):
    cards = {m.id: m for m in served.client().models.list().data}
    assert list(cards) == [CHAT, EMBED]
    assert cards[EMBED].max_model_len == MAX_TOKENS and cards[EMBED].root == model_dir
    assert served.client().models.retrieve(EMBED).id == EMBED


@pytest.fixture(scope="module")
def embed_name() -> str:
    return EMBED


def test_batched_in_one_request_matches_sentence_transformers(served, embed_name, texts, reference):
    out = served.client().embeddings.create(model=embed_name, input=texts)
    assert out.object == "list" and out.model == embed_name and len(out.data) == 64
    assert _cosines(_vectors(out), reference).min() >= MIN_COSINE
    assert out.usage.prompt_tokens == out.usage.total_tokens > 16 * MAX_TOKENS


@pytest.mark.slow
def test_alone_matches_sentence_transformers(served, embed_name, texts, reference):
    client = served.client()
    ours = [client.embeddings.create(model=embed_name, input=t).data[0].embedding for t in texts]
    assert _cosines(ours, reference).min() >= MIN_COSINE


def test_concurrent_with_chat_traffic_is_batched_and_matches(served, embed_name, texts, reference, st_model):
    client = served.client()
    count = 'kvserve:embedding_batch_size_count'
    passes_before = served.metric(count)
    tokens_before = served.metric("kvserve:prompt_tokens_total", 'model="embed"')

    def chat(i):
        return client.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": f"story {i}"}],
                                              max_tokens=24, extra_body={"ignore_eos": True})

    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        chats = [pool.submit(chat, i) for i in range(8)]
        futures = [pool.submit(client.embeddings.create, model=embed_name, input=t) for t in texts]
        ours = [f.result().data[0].embedding for f in futures]
        assert all(c.result().choices[0].finish_reason == "length" for c in chats)
    assert _cosines(ours, reference).min() >= MIN_COSINE
    passes = served.metric(count) - passes_before
    # 64 concurrent one-input requests ran in fewer passes than requests: they were packed together.
    assert 0 < passes < 64
    # Each request's prompt counted once, on the embed model's series.
    tokens = served.metric("kvserve:prompt_tokens_total", 'model="embed"') - tokens_before
    assert tokens == sum(len(ids) for ids in st_model.tokenizer(texts)["input_ids"])


def test_every_input_form_and_base64(served, embed_name, st_model):
    client = served.client()
    text = "The quick brown fox"
    ids = st_model.tokenizer(text)["input_ids"]
    ref = st_model.encode([text], convert_to_numpy=True)
    forms = {"string": text, "strings": [text, text], "ids": ids, "lists of ids": [ids, ids]}
    for name, value in forms.items():
        out = client.embeddings.create(model=embed_name, input=value)
        assert _cosines(_vectors(out), np.repeat(ref, len(out.data), 0)).min() >= MIN_COSINE, name
        assert out.usage.prompt_tokens == len(ids) * len(out.data), name
    # The openai client asks for base64 by default and decodes it; ask explicitly too, raw.
    status, body = served.post("/v1/embeddings", {"model": embed_name, "input": [text], "encoding_format": "base64"})
    assert status == 200
    vector = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    assert vector.shape == (384,) and _cosines([vector], ref)[0] >= MIN_COSINE
    status, floats = served.post("/v1/embeddings", {"model": embed_name, "input": text, "user": "u-1",
                                                    "request_id": "batch-3"})
    assert status == 200 and np.array_equal(np.array(floats["data"][0]["embedding"], dtype=np.float32), vector)
    assert floats["id"] == "embd-batch-3"  # vLLM's request_id names the response


def test_truncate_and_normalize(served, embed_name, st_model):
    long_text = "word " * 700
    status, body = served.post("/v1/embeddings", {"model": embed_name, "input": long_text})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == "input"
    status, body = served.post("/v1/embeddings", {"model": embed_name, "input": long_text,
                                                  "truncate_prompt_tokens": 64})
    assert status == 200 and body["usage"]["prompt_tokens"] == 64
    st_model.max_seq_length = 64
    try:
        ref = st_model.encode([long_text], convert_to_numpy=True)
    finally:
        st_model.max_seq_length = MAX_TOKENS
    assert _cosines([body["data"][0]["embedding"]], ref)[0] >= MIN_COSINE
    status, body = served.post("/v1/embeddings", {"model": embed_name, "input": long_text,
                                                  "truncate_prompt_tokens": -1})
    assert status == 200 and body["usage"]["prompt_tokens"] == MAX_TOKENS
    status, body = served.post("/v1/embeddings", {"model": embed_name, "input": "hello", "normalize": False})
    assert status == 200 and abs(np.linalg.norm(body["data"][0]["embedding"]) - 1.0) > 1e-3


def test_an_input_over_max_seq_length_is_refused_naming_it_or_cut_to_equal_sentence_transformers(
        served, embed_name, st_model):
    """Issue 34: a 300-token input (BERT's positions would take it, the model's max_seq_length of 256
    does not). Without truncate_prompt_tokens a 400 names the limit; with 256 the vector is
    sentence-transformers' own (which cuts at max_seq_length)."""
    text = "word " * 298  # [CLS] + 298 + [SEP]
    assert len(st_model.tokenizer(text)["input_ids"]) == 300
    status, body = served.post("/v1/embeddings", {"model": embed_name, "input": text})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
    assert f"maximum of {MAX_TOKENS}" in body["error"]["message"] and "truncate_prompt_tokens" in body["error"]["message"]
    status, body = served.post("/v1/embeddings", {"model": embed_name, "input": text,
                                                  "truncate_prompt_tokens": MAX_TOKENS})
    assert status == 200 and body["usage"]["prompt_tokens"] == MAX_TOKENS
    ref = st_model.encode([text], convert_to_numpy=True)
    assert _cosines([body["data"][0]["embedding"]], ref)[0] >= MIN_COSINE


@pytest.mark.parametrize("body, param, code", [
    ({"input": ""}, "input", None),
    ({"input": []}, "input", None),
    ({"input": [[]]}, "input", None),
    ({"input": ["a", 1]}, "input", None),
    ({"input": ["x"] * 2049}, "input", None),
    ({"input": [[30522]]}, "input", None),
    ({"input": "x", "dimensions": 128}, "dimensions", None),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", None),
    ({"input": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens", None),
    ({"input": "x", "truncate_prompt_tokens": MAX_TOKENS + 1}, "truncate_prompt_tokens", None),
    ({"input": "x", "normalize": 1}, "normalize", None),
    ({"input": "x", "model": CHAT}, "model", "model_not_supported"),
])
def test_bad_requests_are_400(served, embed_name, body, param, code):
    status, out = served.post("/v1/embeddings", {"model": embed_name, **body})
    assert status == 400, out
    assert out["error"]["param"] == param and (code is None or out["error"]["code"] == code)


def test_embedding_model_on_generation_routes_is_400(served, embed_name):
    status, out = served.post("/v1/chat/completions", {"model": embed_name,
                                                       "messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and out["error"]["param"] == "model" and out["error"]["code"] == "model_not_supported"
    status, out = served.post("/v1/completions", {"model": embed_name, "prompt": "hi"})
    assert status == 400 and out["error"]["code"] == "model_not_supported"
    status, out = served.post("/v1/embeddings", {"model": "nope", "input": "hi"})
    assert status == 404


def test_openapi_documents_the_route(served):
    req = urllib.request.Request(served.url + "/openapi.json", headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        doc = json.loads(resp.read())
    assert "/v1/embeddings" in doc["paths"] and "EmbeddingRequest" in doc["components"]["schemas"]


def test_score_and_rerank_are_the_cosines_of_the_embeddings(served, st_model):
    """vLLM's score and rerank APIs on an embedding model: each pair scores the cosine of its two
    texts' embeddings, here against sentence-transformers' on the same folder."""
    query = "How do I bake bread at home?"
    docs = ["Knead the dough, let it rise, then bake it at 220 degrees.", "The stock market fell sharply today.",
            "Home-made sourdough needs a starter and a lot of time."]
    ref = st_model.encode([query, *docs], convert_to_numpy=True).astype(np.float64)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    expected = ref[1:] @ ref[0]
    status, embedded = served.post("/v1/embeddings", {"model": EMBED, "input": [query, *docs]})
    assert status == 200
    tokens = embedded["usage"]["prompt_tokens"]

    status, out = served.post("/v1/score", {"model": EMBED, "text_1": query, "text_2": docs})  # 1:N
    assert status == 200 and out["object"] == "list" and out["model"] == EMBED and out["id"].startswith("score-")
    assert [(d["index"], d["object"]) for d in out["data"]] == [(0, "score"), (1, "score"), (2, "score")]
    assert np.allclose([d["score"] for d in out["data"]], expected, atol=1e-5)
    assert out["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
    status, out = served.post("/score", {"text_1": [query, docs[0]], "text_2": [docs[0], docs[0]]})  # N:N
    assert status == 200 and np.allclose([d["score"] for d in out["data"]], [expected[0], 1.0], atol=1e-5)

    order = [int(i) for i in np.argsort(-expected)]
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        status, out = served.post(path, {"model": EMBED, "query": query, "documents": docs, "top_n": 2})
        assert status == 200 and out["model"] == EMBED and out["usage"] == {"total_tokens": tokens}
        assert [r["index"] for r in out["results"]] == order[:2]
        assert [r["document"]["text"] for r in out["results"]] == [docs[i] for i in order[:2]]
        assert np.allclose([r["relevance_score"] for r in out["results"]], expected[order[:2]], atol=1e-5)
    status, out = served.post("/v1/rerank", {"query": query, "documents": docs, "return_documents": False})
    assert [r["index"] for r in out["results"]] == order and all("document" not in r for r in out["results"])


def test_score_and_rerank_refuse_clearly(served):
    status, out = served.post("/v1/rerank", {"model": CHAT, "query": "q", "documents": ["d"]})
    assert status == 400 and out["error"]["code"] == "model_not_supported" and "/v1/rerank" in out["error"]["message"]
    status, out = served.post("/v1/score", {"model": "nope", "text_1": "q", "text_2": "d"})
    assert status == 404
    too_long = "bread " * (MAX_TOKENS + 50)
    status, out = served.post("/v1/score", {"text_1": "q", "text_2": ["d", too_long]})
    assert status == 400 and out["error"]["code"] == "context_length_exceeded"
    assert out["error"]["param"] == "truncate_prompt_tokens"
    status, out = served.post("/v1/score", {"text_1": "q", "text_2": ["d", too_long], "truncate_prompt_tokens": -1})
    assert status == 200 and len(out["data"]) == 2
    assert served.post("/v1/embeddings", {"model": EMBED, "input": "still serving"})[0] == 200
