"""The encoder against sentence-transformers on all-MiniLM-L6-v2: 64 texts (short,
multilingual, long, at the model's 256-token limit), each alone, all in one packed pass,
and through the batcher with concurrent requests."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from kvserve.backend.embed.embed_batcher import EmbeddingBatcher, EmbedJob
from kvserve.backend.embed.embedder import Embedder, EmbedderConfig
from kvserve.backend.models.bert import PackedBatch, varlen_attention
from kvserve.seam.error_wire import ErrorKind, RequestError
from tests.backend.embed.embed_fixtures import MAX_TOKENS, minilm_dir, parity_texts

MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def model_dir() -> str:
    return minilm_dir()


@pytest.fixture(scope="module")
def embedder(model_dir) -> Embedder:
    return Embedder(EmbedderConfig(model=model_dir))


@pytest.fixture(scope="module")
def texts(embedder) -> list[str]:
    return parity_texts(lambda t: len(embedder.tokenize([t], None)[0]))


@pytest.fixture(scope="module")
def reference(model_dir, texts) -> np.ndarray:
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(model_dir, device="cpu")
    assert model.max_seq_length == MAX_TOKENS  # the folder's own limit, which kvserve takes too
    return model.encode(texts, batch_size=8, convert_to_numpy=True)


def _cosines(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    ours, ref = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))


def test_texts_cover_the_limit(embedder, texts):
    lengths = [len(ids) for ids in embedder.tokenize(texts, None)]
    assert min(lengths) <= 3 and lengths.count(MAX_TOKENS) == 16 and max(lengths) == MAX_TOKENS


@pytest.mark.slow
def test_alone_matches_sentence_transformers(embedder, texts, reference):
    ours = np.stack([embedder.finish(embedder.embed(embedder.tokenize([t], None)), None, None)[0].numpy()
                     for t in texts])
    assert _cosines(ours, reference).min() >= MIN_COSINE


def test_one_packed_pass_matches_sentence_transformers(embedder, texts, reference):
    ids = embedder.tokenize(texts, None)
    ours = embedder.finish(embedder.embed(ids), None, None).numpy()
    assert _cosines(ours, reference).min() >= MIN_COSINE
    # Normalised as the folder's modules.json asks: unit vectors, like the reference.
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_batcher_packs_concurrent_requests(embedder, texts, reference):
    batches: list[int] = []

    class Listener:
        def on_batch(self, num_inputs, num_tokens, seconds):
            batches.append(num_inputs)

        def on_finished(self, job, result):
            pass

    # 4 requests of 16 inputs, submitted while the batcher is held: they must share passes.
    ids = embedder.tokenize(texts, None)
    gate = threading.Lock()
    gate.acquire()
    original = embedder.embed
    first = threading.Event()

    def held_embed(inputs):
        if not first.is_set():
            first.set()
            gate.acquire()
        return original(inputs)

    embedder.embed = held_embed
    try:
        batcher = EmbeddingBatcher(embedder, Listener())
        results: dict[str, object] = {}
        done = threading.Event()

        def on_done(result):
            results[result.request_id] = result
            if len(results) == 5:
                done.set()

        batcher.submit(EmbedJob("warm", [ids[0]], None, None, on_done))
        assert first.wait(10)
        for r in range(4):
            batcher.submit(EmbedJob(f"r{r}", ids[16 * r:16 * (r + 1)], None, None, on_done))
        gate.release()
        assert done.wait(60)
        batcher.shutdown()
    finally:
        embedder.embed = original
    ours = np.concatenate([results[f"r{r}"].embeddings for r in range(4)])
    assert _cosines(ours, reference).min() >= MIN_COSINE
    # 64 inputs of up to 256 tokens under a 16384-token budget: the 4 requests share passes.
    assert batches[0] == 1 and len(batches) < 5 and max(batches[1:]) > 16
    assert sum(batches) == 65


@pytest.mark.slow
def test_token_budget_splits_a_request_over_passes(model_dir, texts, reference):
    small = Embedder(EmbedderConfig(model=model_dir, max_num_batched_tokens=1024, max_num_seqs=8))
    sizes, tokens = [], []

    class Listener:
        def on_batch(self, num_inputs, num_tokens, seconds):
            sizes.append(num_inputs)
            tokens.append(num_tokens)

        def on_finished(self, job, result):
            pass

    batcher = EmbeddingBatcher(small, Listener())
    got = []
    done = threading.Event()
    batcher.submit(EmbedJob("big", small.tokenize(texts, None), None, None, lambda r: (got.append(r), done.set())))
    assert done.wait(120)
    batcher.shutdown()
    assert max(tokens) <= 1024 and max(sizes) <= 8 and sum(sizes) == 64 and got[0].num_passes == len(sizes)
    assert _cosines(got[0].embeddings, reference).min() >= MIN_COSINE


def test_truncation_matches_sentence_transformers_cut(model_dir, embedder, texts):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(model_dir, device="cpu")
    model.max_seq_length = 64
    long_texts = texts[-4:]
    ids = embedder.tokenize(long_texts, 64)
    assert all(len(x) == 64 and x[0] == ids[0][0] and x[-1] == ids[0][-1] for x in ids)  # [CLS] ... [SEP]
    ours = embedder.finish(embedder.embed(ids), None, None).numpy()
    assert _cosines(ours, model.encode(long_texts, convert_to_numpy=True)).min() >= MIN_COSINE


def test_varlen_attention_equals_per_sequence_attention():
    torch.manual_seed(0)
    lens = [5, 1, 17, 16, 3, 40, 2]
    batch = PackedBatch.build([[1] * n for n in lens], torch.device("cpu"))
    assert len(batch.groups) > 1  # lengths this spread are not padded to one width
    qkv = torch.randn(sum(lens), 3, 4, 8)
    out = varlen_attention(qkv, batch)
    start = 0
    for n in lens:
        q, k, v = qkv[start:start + n].permute(1, 2, 0, 3)  # [heads, n, d] each
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(0, 1).reshape(n, 32)
        torch.testing.assert_close(out[start:start + n], ref)
        start += n


def test_checks_name_the_field(embedder):
    def refused(call, *args):
        with pytest.raises(RequestError) as info:
            call(*args)
        return info.value.kind, info.value.param

    assert refused(embedder.check, [[101] * (MAX_TOKENS + 1)], None) == (ErrorKind.CONTEXT_LENGTH, "input")
    assert len(embedder.check([[101] * (MAX_TOKENS + 1)], MAX_TOKENS)[0]) == MAX_TOKENS
    assert refused(embedder.check, [[embedder.vocab_size]], None) == (ErrorKind.INVALID, "input")
    assert refused(embedder.check, [[]], None) == (ErrorKind.INVALID, "input")
    assert refused(embedder.check_dimensions, 128) == (ErrorKind.INVALID, "dimensions")


def test_cpu_fp32_encoder_runs_packed_onednn_linears(model_dir, embedder, texts, reference, monkeypatch):
    from kvserve.backend.models.cpu_linear import PackedLinear
    layer = embedder.model.layers[0]
    assert all(isinstance(getattr(layer, n), PackedLinear) for n in ("qkv", "attn_out", "ffn_in", "ffn_out"))
    monkeypatch.setenv("KVSERVE_CPU_PACKED_LINEAR", "0")  # F.linear and a separate GELU: the same vectors
    plain = Embedder(EmbedderConfig(model=model_dir))
    assert isinstance(plain.model.layers[0].ffn_in, torch.nn.Linear)
    ids = embedder.tokenize(texts[:16], None)
    assert _cosines(plain.finish(plain.embed(ids), None, None).numpy(), reference[:16]).min() >= MIN_COSINE
    torch.testing.assert_close(embedder.embed(ids), plain.embed(ids), rtol=0, atol=1e-4)
