"""Greedy tokens of the engine equal Hugging Face transformers' on the same weights (float32)."""
from __future__ import annotations

import random

import pytest

from kvserve.backend import LLM, SamplingParams
from tests.conftest import GPU_ENGINE_ARGS, tiny_model
from tests.parity.hf_reference import hf_greedy

MAX_NEW = 24


def _prompts(seed: int, vocab: int = 500, count: int = 10) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 3, 7, 16, 17, 31, 40, 64, 90, 130][:count]
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def _engine_greedy(model_dir: str, prompts, **engine_args) -> tuple[list[list[int]], LLM]:
    llm = LLM(model=model_dir, dtype="float32", **{**GPU_ENGINE_ARGS, **engine_args})
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True)
    outs = llm.generate(prompts, params)
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    return [o.outputs[0].token_ids for o in outs], llm


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_batched_greedy_matches_transformers(arch):
    model_dir = tiny_model(arch)
    prompts = _prompts(seed=len(arch))
    ours, llm = _engine_greedy(model_dir, prompts, max_num_seqs=32)
    assert ours == hf_greedy(model_dir, prompts, MAX_NEW)
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_usable_blocks


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_chunked_prefill_matches_transformers(arch):
    """A token budget of 13 forces every long prompt through several chunks mixed with decodes."""
    model_dir = tiny_model(arch)
    prompts = _prompts(seed=7)
    ours, llm = _engine_greedy(model_dir, prompts, max_num_seqs=8, max_num_batched_tokens=13)
    assert ours == hf_greedy(model_dir, prompts, MAX_NEW)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_preemption_matches_transformers(arch):
    """A KV budget far below the batch's needs forces preemption by recompute."""
    model_dir = tiny_model(arch)
    prompts = _prompts(seed=11)
    # 160 usable tokens; the batch needs ~650: requests must be preempted and recomputed.
    ours, llm = _engine_greedy(model_dir, prompts, max_num_seqs=16, num_kv_blocks=11, block_size=16,
                               max_model_len=160)
    assert llm.engine.scheduler.num_preemptions_total > 0
    assert ours == hf_greedy(model_dir, prompts, MAX_NEW)
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_usable_blocks
