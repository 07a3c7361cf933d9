"""Sliding-window layers against transformers on random weights: Mistral (every layer sliding),
Qwen2 (the first layer full, the rest sliding) and Gemma 3 (sliding and full layers, its own norms,
GeGLU and per-layer-type rope), with windows far shorter than the prompts, so that every layer type
drops positions in prefill, in chunked prefill and while decoding."""
from __future__ import annotations

import random

import pytest

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.models.tiny import TinySpec, make_tiny_model
from tests.conftest import GPU_ENGINE_ARGS, MODEL_CACHE
from tests.parity.hf_reference import hf_greedy

MAX_NEW = 24
WINDOW = 8
SPECS = {
    "mistral": TinySpec(arch="mistral", num_heads=4, num_kv_heads=2, sliding_window=WINDOW, seed=21),
    "qwen2": TinySpec(arch="qwen2", num_heads=4, num_kv_heads=1, sliding_window=WINDOW, seed=22),
    "gemma3": TinySpec(arch="gemma3", num_layers=3, num_heads=4, num_kv_heads=1, head_dim=32,
                       sliding_window=WINDOW, seed=23),
}


def _model(arch: str) -> str:
    return str(make_tiny_model(MODEL_CACHE / f"sliding-{arch}", SPECS[arch]))


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(n)] for n in (1, 5, 8, 9, 17, 33, 60)]


def _greedy(model_dir: str, prompts, **engine_args) -> list[list[int]]:
    llm = LLM(model=model_dir, dtype="float32", **{**GPU_ENGINE_ARGS, **engine_args})
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True))
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_usable_blocks
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("arch", sorted(SPECS))
def test_sliding_window_greedy_matches_transformers(arch):
    model_dir, prompts = _model(arch), _prompts(seed=len(arch))
    assert _greedy(model_dir, prompts, max_num_seqs=16, block_size=4) == hf_greedy(model_dir, prompts, MAX_NEW)


@pytest.mark.parametrize("arch", ["gemma3", "mistral"])
def test_sliding_window_chunked_prefill_matches_transformers(arch):
    """A budget of 5 tokens: chunks shorter than the window, and chunks that start past it."""
    model_dir, prompts = _model(arch), _prompts(seed=5)
    ours = _greedy(model_dir, prompts, max_num_seqs=4, max_num_batched_tokens=5, block_size=4)
    assert ours == hf_greedy(model_dir, prompts, MAX_NEW)


@pytest.mark.parametrize("arch", ["gemma3", "qwen2"])
def test_sliding_window_prefix_hits_match_transformers(arch):
    """The prompts twice with prefix caching: the second pass starts from cached blocks of every
    KV cache group, the sliding groups' unseen hits left out."""
    model_dir, prompts = _model(arch), _prompts(seed=9)
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=16, block_size=4, enable_prefix_caching=True,
              **GPU_ENGINE_ARGS)
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True)
    first = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    hits = llm.engine.kv.prefix_hits
    again = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    assert llm.engine.kv.prefix_hits > hits
    assert first == again == hf_greedy(model_dir, prompts, MAX_NEW)
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_usable_blocks


def test_sliding_window_preemption_matches_transformers():
    model_dir, prompts = _model("gemma3"), _prompts(seed=13)
    # 3 groups of one layer; the longest request needs ~21 blocks in the full group alone.
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=8, block_size=4, num_kv_blocks=48, max_model_len=84,
              **GPU_ENGINE_ARGS)
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True))
    assert llm.engine.scheduler.num_preemptions_total > 0
    assert [list(o.outputs[0].token_ids) for o in outs] == hf_greedy(model_dir, prompts, MAX_NEW)
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_usable_blocks
