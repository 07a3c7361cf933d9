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

import torch

# Read when this module is first imported (on the thread that imports the engine, before any
# engine or embedding worker has changed a count): torch.set_num_threads on any thread also sets
# the count that threads started later begin with, so reading it later, from a fresh thread, can
# see another component's choice (an embedding worker's one thread) instead of torch's default.
_TORCH_DEFAULT_THREADS = torch.get_num_threads()


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


def torch_default_threads() -> int:
    """torch's thread count before any engine of this process changed it (a second engine
    reading the current count would reserve cores twice)."""
    return _TORCH_DEFAULT_THREADS
