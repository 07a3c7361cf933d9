"""How many CPU threads the engine's torch ops may use.

torch runs each op's parallel part on an OpenMP team whose threads meet at a
barrier at its end, so a team that spans every core is slowed by anything else
that runs on them: a serving thread that preempts one member stalls the whole
team until it is back. On 2 cores the serving path (gateway, the host's gRPC,
the benchmark client) costs the engine 1.4-1.8x the CPU it takes
(BENCHMARKS.md section 2). Reserving cores for it, as vLLM's CPU backend does
with VLLM_CPU_NUM_OF_RESERVED_CPU, removes that amplification at the price of
the engine's share of the reserved cores: worth it when the engine has many
cores and one is a small part of them, not on 2 (measured there: the engine
alone on one core runs at 0.67x its speed on two).
"""
from __future__ import annotations

import functools


def engine_threads(num_threads: int | None, reserved_cores: int, default_threads: int) -> int | None:
    """The thread count to set, or None to keep torch's default.

    `default_threads` is torch's own choice (OMP_NUM_THREADS, else the cores it
    sees); reserved cores come off that. An explicit `num_threads` wins.
    """
    if num_threads:
        return num_threads
    if reserved_cores <= 0:
        return None
    if reserved_cores >= default_threads:
        raise ValueError(f"cpu_reserved_cores: {reserved_cores} leaves no CPU thread for the engine "
                         f"({default_threads} available; reserve at most {default_threads - 1})")
    return default_threads - reserved_cores


@functools.cache
def torch_default_threads() -> int:
    """torch's thread count before any engine of this process changed it.

    torch.set_num_threads also sets the count threads started later begin with,
    so a second engine in one process must not read it again (it would reserve
    cores twice)."""
    import torch

    return torch.get_num_threads()
