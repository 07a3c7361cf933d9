"""The engine on the Triton kernels (interpreter on CPU) gives the greedy tokens of torch and transformers."""
from __future__ import annotations

import random

import pytest

from kvserve.backend import LLM, SamplingParams
from tests.conftest import GPU_ENGINE_ARGS, tiny_model
from tests.parity.hf_reference import hf_greedy

MAX_NEW = 8


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_triton_backend_matches_torch_and_transformers(arch):
    model_dir = tiny_model(arch)
    rng = random.Random(3)
    # Ragged lengths, one past a block boundary, and a chunked prefill (budget 24) mixed with decodes.
    prompts = [[rng.randrange(3, 500) for _ in range(n)] for n in (1, 5, 17, 40)]
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True)
    common = dict(dtype="float32", block_size=8, max_num_batched_tokens=24, max_model_len=128, **GPU_ENGINE_ARGS)
    triton_llm = LLM(model=model_dir, attention_backend="triton", **common)
    assert triton_llm.engine.runner.ops.name == "triton"
    triton_tokens = [o.outputs[0].token_ids for o in triton_llm.generate(prompts, params)]
    torch_tokens = [o.outputs[0].token_ids for o in LLM(model=model_dir, attention_backend="torch",
                                                        **common).generate(prompts, params)]
    assert triton_tokens == torch_tokens
    assert triton_tokens == hf_greedy(model_dir, prompts, MAX_NEW)
