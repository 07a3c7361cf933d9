"""The model on the Triton kernels gives transformers' logits, in float32 and in bfloat16.

Greedy-token equality (test_triton_backend.py) is the float32 check; in bfloat16 two
correct implementations pick different tokens at near-ties, so here the logits of a
prefill and of teacher-forced decode steps are compared with transformers run in the same
dtype on the same device, by ||ours - hf|| / ||hf|| per step:

    float32   <= 1e-4  (both sides accumulate in float32; the kernels' dots are IEEE: TF32 would miss this)
    bfloat16  <= 5e-2  (bf16 activations round at ~4e-3 per op; seen 1-2e-2 on the CPU; a wrong stride or
                        head is O(1))

On a GPU this runs the kernels on CUDA against transformers on CUDA (gpu_check runs it
there); on the CPU, the Triton interpreter against transformers on the CPU.
"""
from __future__ import annotations

import random

import pytest
import torch

from kvserve.backend.engine.config import EngineConfig
from kvserve.backend.engine.scheduler import ScheduledRequest, SchedulerOutput
from kvserve.backend.worker.model_runner import ModelRunner
from tests.conftest import tiny_model

TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2}
PROMPT, DECODE, BLOCK = 21, 6, 8


def _ours(model_dir: str, dtype: str, tokens: list[int]) -> torch.Tensor:
    runner = ModelRunner(EngineConfig(model=model_dir, dtype=dtype, attention_backend="triton", block_size=BLOCK,
                                      max_model_len=64, num_kv_blocks=1 + 64 // BLOCK))
    assert runner.ops.name == "triton"
    blocks = list(range(1, 1 + -(-len(tokens) // BLOCK)))  # block 0 is the null block
    steps = [SchedulerOutput(scheduled=[ScheduledRequest("r", tokens[:PROMPT], 0, [blocks], True)])]  # the whole table
    steps += [SchedulerOutput(scheduled=[ScheduledRequest("r", [tokens[p]], p, [[]], True)])  # no new blocks
              for p in range(PROMPT, len(tokens))]
    return torch.cat([runner.execute(step)[0].float().cpu() for step in steps])


def _hf(model_dir: str, dtype: str, tokens: list[int], device: torch.device) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([tokens], device=device)).logits[0]
    return logits[PROMPT - 1:].float().cpu()  # the prefill's last row, then one row per decode step


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_triton_logits_match_transformers(arch, dtype):
    model_dir = tiny_model(arch)
    rng = random.Random(5)
    tokens = [rng.randrange(3, 500) for _ in range(PROMPT + DECODE)]
    ours = _ours(model_dir, dtype, tokens)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ref = _hf(model_dir, dtype, tokens, device)
    assert ours.shape == ref.shape == (DECODE + 1, ref.shape[1])
    assert torch.isfinite(ours).all()
    errors = ((ours - ref).norm(dim=-1) / ref.norm(dim=-1)).tolist()
    assert max(errors) <= TOLERANCE[dtype], f"relative logit error per step {errors} (tolerance {TOLERANCE[dtype]})"
