"""The embed model in the embedded host, through the real tritonclient (KServe v2 gRPC)."""
from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from kvserve.backend.embed.embedder import Embedder, EmbedderConfig
from tests.backend.embed.embed_fixtures import minilm_dir
from tests.utils.processes import run_host

TEXTS = ["hello world", "Grüß Gott, wie geht's?", "a longer sentence about key-value caches and batching"]


@pytest.fixture(scope="module")
def model_dir() -> str:
    return minilm_dir()


@pytest.fixture(scope="module")
def host(model_dir):
    with run_host({"KVSERVE_EMBED_MODEL": model_dir, "KVSERVE_EMBED_MAX_INPUTS_PER_REQUEST": "8"},
                  models=("embed",)) as h:
        yield h


@pytest.fixture(scope="module")
def embedder(model_dir) -> Embedder:
    return Embedder(EmbedderConfig(model=model_dir))


def _infer(url, texts=None, ids=None, params=None):
    inputs = []
    if texts is not None:
        t = grpcclient.InferInput("text_input", [len(texts)], "BYTES")
        t.set_data_from_numpy(np.array([x.encode() for x in texts], dtype=np.object_))
        inputs.append(t)
    if ids is not None:
        flat = [i for x in ids for i in x]
        t = grpcclient.InferInput("input_ids", [len(flat)], "INT32")
        t.set_data_from_numpy(np.array(flat, dtype=np.int32))
        n = grpcclient.InferInput("input_lengths", [len(ids)], "INT32")
        n.set_data_from_numpy(np.array([len(x) for x in ids], dtype=np.int32))
        inputs += [t, n]
    if params is not None:
        p = grpcclient.InferInput("pooling_parameters", [1], "BYTES")
        p.set_data_from_numpy(np.array([json.dumps(params).encode()], dtype=np.object_))
        inputs.append(p)
    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    client.async_stream_infer("embed", inputs, request_id="e", enable_empty_final_response=True)
    result, error = q.get(timeout=60)
    client.stop_stream()
    client.close()
    if error is not None:
        return None, error
    assert result.get_response().parameters["triton_final_response"].bool_param
    return result, None


def test_texts_and_ids_give_the_model_s_vectors(host, embedder):
    result, error = _infer(host.grpc_url, texts=TEXTS)
    assert error is None
    vectors = result.as_numpy("embedding")
    ids = embedder.tokenize(TEXTS, None)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert result.as_numpy("prompt_tokens").tolist() == [len(x) for x in ids]
    expected = embedder.finish(embedder.embed(ids), None, None).numpy()
    assert np.abs(vectors - expected).max() < 1e-5
    by_ids, error = _infer(host.grpc_url, ids=ids)
    assert error is None and np.abs(by_ids.as_numpy("embedding") - vectors).max() < 1e-6


def test_pooling_parameters(host, embedder):
    raw, _ = _infer(host.grpc_url, texts=TEXTS[:1], params={"normalize": False})
    norm = np.linalg.norm(raw.as_numpy("embedding"), axis=1)
    assert abs(norm[0] - 1.0) > 1e-3  # mean pooling alone does not give unit vectors
    cut, _ = _infer(host.grpc_url, texts=["word " * 600], params={"truncate_prompt_tokens": 16})
    assert cut.as_numpy("prompt_tokens").tolist() == [16]
    limit, _ = _infer(host.grpc_url, texts=["word " * 600], params={"truncate_prompt_tokens": -1})
    assert limit.as_numpy("prompt_tokens").tolist() == [256]  # the model's max_seq_length


@pytest.mark.parametrize("kwargs, message", [
    ({"texts": ["word " * 600]}, "context_length_exceeded"),
    ({"texts": [""]}, "input: input 0 is an empty string"),
    ({"texts": ["x"] * 9}, "input: at most 8 inputs per request"),
    ({"texts": ["x"], "params": {"dimensions": 64}}, "dimensions: "),
    ({"texts": ["x"], "params": {"truncate_prompt_tokens": 0}}, "truncate_prompt_tokens: "),
    ({"texts": ["x"], "params": {"normalize": "yes"}}, "normalize: must be a boolean"),
    ({"texts": ["x"], "params": {"pooling": "cls"}}, "pooling_parameters: unknown field"),
    ({"ids": [[30522]]}, "input: input 0 holds a token id outside"),
    ({"ids": [[101, 102], []]}, "input: input 1 is empty"),
    ({}, "text_input: one of text_input or input_ids is required"),
])
def test_bad_requests_are_invalid_arg(host, kwargs, message):
    result, error = _infer(host.grpc_url, **kwargs)
    assert result is None and message in error.message()


def test_batch_metrics(host):
    _infer(host.grpc_url, texts=TEXTS)
    text = host.metrics_text()
    assert 'kvserve:embedding_batch_size_count{model="embed",version="1"}' in text
    assert host.metric("kvserve:prompt_tokens_total") > 0
