"""How many KV blocks fit: the arithmetic of `--gpu-memory-utilization` on CUDA and of the CPU's
default size, kept apart from torch.

On CUDA the engine may use `total * gpu_memory_utilization` bytes of the device
(vLLM's meaning: the fraction of the whole GPU this instance owns, not of what
is free). Out of that come, measured at start-up by the model runner:

    +---------------------------------------- total device memory --------------------------+
    | this instance: total * utilization                                      | others/spare |
    | weights | peak activation | non-torch (CUDA context, | KV cache (what   |              |
    |         | of one max step | cuBLAS, Triton modules)  |   is left)       |              |
    +-------------------------------------------------------------------------+--------------+

The peak activation is what a forward pass of `max_num_batched_tokens` tokens
(and the sampler's rows) allocates above the weights: the KV cache must leave
that free, or the first large prefill runs out of memory. Memory that other
processes hold is not ours to subtract: if they leave less free than this
instance asks for, start-up fails with a message saying so, as vLLM's does.

On the CPU, without `--kv-cache-memory` or `--num-kv-blocks`, the cache gets
half of the RAM that is available once the weights are loaded (host_memory.py:
MemAvailable, or a container's cgroup headroom when smaller), but never more
than every sequence at its full length can use:

    kv bytes = min(CPU_KV_SHARE * available after the weights,
                   max_num_seqs * blocks of one max_model_len request * block bytes)

vLLM's CPU backend, with VLLM_CPU_KVCACHE_SPACE unset, takes half of the total
RAM of a NUMA node (each of its workers is bound to one). kvserve's engine is
one process over the machine, and it takes half of what is *available*, not of
the total: the weights and what other processes hold are not its to give out,
and the other half stays for activations, the serving path and the page cache.
Where the host's memory cannot be read, CPU_KV_FALLBACK_BYTES.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CudaMemoryProfile:
    total: int              # the device's memory
    free_at_start: int      # free before the engine allocated anything
    weights: int            # torch-allocated bytes after the weights loaded
    peak_activation: int    # torch's peak during the profile step, above the weights
    non_torch: int          # growth outside torch's allocator while loading and profiling

    @property
    def non_kv(self) -> int:
        return self.weights + self.peak_activation + self.non_torch


def profile_query_lens(max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int) -> list[int]:
    """The largest step the scheduler can hand out: its token budget over as many requests as
    may run, none longer than the model's context. Tokens per request, as even as possible."""
    num_tokens = min(max_num_batched_tokens, max_num_seqs * max_model_len)
    num_seqs = min(max_num_seqs, num_tokens)
    return [num_tokens // num_seqs + (i < num_tokens % num_seqs) for i in range(num_seqs)]


def kv_budget_bytes(profile: CudaMemoryProfile, utilization: float) -> int:
    """Bytes left for the KV cache; raises ValueError naming the flag to change."""
    requested = int(profile.total * utilization)
    gib = 2 ** 30
    if profile.free_at_start < requested:
        raise ValueError(
            f"gpu_memory_utilization: {utilization} asks for {requested / gib:.2f} GiB of the device's "
            f"{profile.total / gib:.2f} GiB, but only {profile.free_at_start / gib:.2f} GiB were free at start-up "
            f"(another process holds the rest); lower --gpu-memory-utilization")
    budget = requested - profile.non_kv
    if budget <= 0:
        raise ValueError(
            f"gpu_memory_utilization: {utilization} gives {requested / gib:.2f} GiB, less than the "
            f"{profile.non_kv / gib:.2f} GiB the model needs without KV cache (weights {profile.weights / gib:.2f}, "
            f"peak activation {profile.peak_activation / gib:.2f}, non-torch {profile.non_torch / gib:.2f} GiB); "
            f"raise --gpu-memory-utilization or lower --max-num-batched-tokens")
    return budget


def describe(profile: CudaMemoryProfile, utilization: float, kv_bytes: int) -> str:
    """The start-up log line: where this instance's share of the device goes."""
    gib = 2 ** 30
    return (f"CUDA memory: {profile.total / gib:.2f} GiB total, {profile.free_at_start / gib:.2f} free at start; "
            f"gpu_memory_utilization {utilization} -> {profile.total * utilization / gib:.2f} GiB for this engine: "
            f"weights {profile.weights / gib:.2f}, peak activation {profile.peak_activation / gib:.2f}, "
            f"non-torch {profile.non_torch / gib:.2f}, KV cache {kv_bytes / gib:.2f} GiB")


CPU_KV_SHARE = 0.5
CPU_KV_FALLBACK_BYTES = 512 * 2 ** 20


@dataclass(frozen=True, slots=True)
class CpuKVBudget:
    bytes: int
    reason: str  # where the size came from: the start-up log line


def cpu_kv_budget(available: int | None, wanted: int, source: str = "MemAvailable") -> CpuKVBudget:
    """The CPU's default KV cache size (see the module doc). `available`: bytes of RAM left after the
    weights loaded (None: unknown); `wanted`: what every sequence at full length would hold."""
    gib = 2 ** 30
    if available is None:
        share, why = CPU_KV_FALLBACK_BYTES, (f"{CPU_KV_FALLBACK_BYTES / gib:.2f} GiB, the fallback (the host's "
                                             f"memory could not be read)")
    else:
        share = int(available * CPU_KV_SHARE)
        why = (f"{share / gib:.2f} GiB = {CPU_KV_SHARE} x the {available / gib:.2f} GiB of RAM available after "
               f"the weights ({source})")
    if wanted < share:
        return CpuKVBudget(wanted, f"{wanted / gib:.2f} GiB, every sequence at full length (less than {why})")
    return CpuKVBudget(share, why)
