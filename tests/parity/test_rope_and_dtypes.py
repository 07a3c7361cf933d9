"""Rope scaling variants and bfloat16 load through the same loader as real checkpoints."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from kvserve.backend import LLM, SamplingParams
from tests.conftest import GPU_ENGINE_ARGS, tiny_model
from tests.parity.hf_reference import hf_greedy

SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
}


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_rope_scaling_matches_transformers(kind, tmp_path):
    src = tiny_model("llama")
    dst = tmp_path / f"llama-{kind}"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["rope_scaling"] = SCALINGS[kind]
    cfg["rope_theta"] = 500.0  # low theta makes the scaled frequencies matter within a short context
    (dst / "config.json").write_text(json.dumps(cfg))
    prompts = [list(range(3, 3 + n)) for n in (5, 70, 150)]
    llm = LLM(model=str(dst), dtype="float32", max_model_len=256, **GPU_ENGINE_ARGS)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=10, temperature=0,
                                                                                ignore_eos=True))]
    assert ours == hf_greedy(str(dst), prompts, 10)
    # The scaling must matter here, or the comparison above would prove nothing about it.
    del cfg["rope_scaling"]
    (dst / "config.json").write_text(json.dumps(cfg))
    plain = LLM(model=str(dst), dtype="float32", max_model_len=256, **GPU_ENGINE_ARGS).generate(
        prompts, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in plain] != ours


def test_bfloat16_weights_load_and_stay_close_to_float32():
    src = tiny_model("qwen2")
    prompt = list(range(10, 60))
    runs = {}
    for dtype in ("float32", "bfloat16"):
        llm = LLM(model=src, dtype=dtype, max_model_len=128, **GPU_ENGINE_ARGS)
        assert llm.engine.runner.dtype == getattr(torch, dtype)
        assert llm.engine.runner.kv_caches[0][0].dtype == getattr(torch, dtype)
        out = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0, logprobs=5))[0]
        runs[dtype] = out.outputs[0].logprobs[0]
    f32, bf16 = runs["float32"], runs["bfloat16"]
    assert f32.top[0][0] == bf16.top[0][0]  # same best token
    assert abs(f32.top[0][1] - bf16.top[0][1]) < 0.1
