"""KV budget arithmetic (backend/kv_cache/kv_budget.py): --gpu-memory-utilization, the CPU's default
size, and the runner's profile step, on the CPU."""
from __future__ import annotations

import pytest
import torch

from kvserve.backend.engine.config import EngineConfig
from kvserve.backend.kv_cache.kv_budget import (CPU_KV_FALLBACK_BYTES, CudaMemoryProfile, cpu_kv_budget, describe,
                                                kv_budget_bytes, profile_query_lens)
from kvserve.backend.worker.model_runner import ModelRunner

GIB = 2 ** 30


def _profile(**kw) -> CudaMemoryProfile:
    base = dict(total=140 * GIB, free_at_start=139 * GIB, weights=16 * GIB, peak_activation=3 * GIB,
                non_torch=1 * GIB)
    return CudaMemoryProfile(**{**base, **kw})


def test_budget_is_the_fraction_of_total_less_weights_activation_and_non_torch():
    p = _profile()
    assert kv_budget_bytes(p, 0.9) == int(140 * GIB * 0.9) - 20 * GIB
    assert kv_budget_bytes(p, 0.5) == 70 * GIB - 20 * GIB
    # The peak activation is what separates this from "free memory after loading the weights".
    assert kv_budget_bytes(_profile(peak_activation=0), 0.5) - kv_budget_bytes(p, 0.5) == 3 * GIB


def test_memory_other_processes_hold_is_checked_not_subtracted():
    # 60 GiB free, half the card asked for: refused with the flag named.
    with pytest.raises(ValueError, match="gpu_memory_utilization: 0.5 .* only 60.00 GiB were free"):
        kv_budget_bytes(_profile(free_at_start=60 * GIB), 0.5)
    # Enough free: what others hold does not shrink this instance's share.
    assert kv_budget_bytes(_profile(free_at_start=71 * GIB), 0.5) == 50 * GIB


def test_a_share_smaller_than_the_model_is_refused():
    with pytest.raises(ValueError, match="lower --max-num-batched-tokens"):
        kv_budget_bytes(_profile(), 0.1)


def test_log_line_names_every_part():
    line = describe(_profile(), 0.5, 50 * GIB)
    for part in ("140.00 GiB total", "weights 16.00", "peak activation 3.00", "non-torch 1.00", "KV cache 50.00"):
        assert part in line


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_profile_step_runs_the_largest_step_without_touching_a_cache(llama_dir, backend):
    cfg = EngineConfig(model=llama_dir, max_num_seqs=5, max_num_batched_tokens=37, max_model_len=64,
                       num_kv_blocks=8, attention_backend=backend)
    runner = ModelRunner(cfg)
    logits = runner.profile_step()
    assert logits.shape == (5, runner.arch.vocab_size) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    assert all(not k.any() and not v.any() for k, v in runner.kv_caches)  # the real cache stays untouched


def test_profile_step_is_the_schedulers_largest_step():
    assert profile_query_lens(2048, 64, 4096) == [32] * 64          # the token budget over every sequence
    assert profile_query_lens(37, 5, 64) == [8, 8, 7, 7, 7]          # as even as possible
    assert profile_query_lens(2048, 3, 8) == [8, 8, 8]              # no request past the context
    assert profile_query_lens(4, 64, 4096) == [1, 1, 1, 1]           # fewer tokens than sequences


def test_cpu_default_is_half_the_ram_available_after_the_weights():
    budget = cpu_kv_budget(available=13 * GIB, wanted=40 * GIB)
    assert budget.bytes == int(6.5 * GIB)
    assert "6.50 GiB = 0.5 x the 13.00 GiB of RAM available after the weights (MemAvailable)" == budget.reason
    # A container's headroom, named as its source.
    assert "(cgroup memory.max)" in cpu_kv_budget(2 * GIB, 40 * GIB, "cgroup memory.max").reason


def test_cpu_default_never_exceeds_every_sequence_at_full_length():
    # 64 sequences of 8192 tokens of SmolLM2 in float32 (45 KiB a token): 22.5 GiB, more than half of 24.
    assert cpu_kv_budget(24 * GIB, 64 * 8192 * 46080).bytes == 12 * GIB
    # A test engine's small model and context: what it can use, not GiBs it never touches.
    small = cpu_kv_budget(24 * GIB, 16 * 256 * 512)
    assert small.bytes == 16 * 256 * 512 and small.reason.startswith("0.00 GiB, every sequence at full length")


def test_cpu_default_without_the_hosts_memory_is_the_fallback():
    budget = cpu_kv_budget(None, 40 * GIB)
    assert budget.bytes == CPU_KV_FALLBACK_BYTES and "could not be read" in budget.reason
    assert cpu_kv_budget(None, 1024).bytes == 1024
