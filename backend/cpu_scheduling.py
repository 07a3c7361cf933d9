"""Linux's SCHED_BATCH policy for the threads that run engine steps.

Why: on a CPU engine, torch's OpenMP team fills every core, and the serving
work beside it (the gateway, the host's gRPC and response threads, a client)
runs in short bursts. Under the default policy an engine thread that wakes up
(at every OpenMP barrier and every GIL hand-off, thousands of times a second)
preempts whatever runs on its core: usually a serving thread in mid-burst,
often one holding the host's GIL, which the engine thread then has to wait
for while that thread waits for a core. SCHED_BATCH tells the kernel these
threads are throughput work: they keep their CPU share (the nice value does
not change), but their wake-ups no longer preempt other threads, so serving
bursts finish and hand the GIL back. BENCHMARKS.md §2 has the measurement.

Threads take the policy of the thread that creates them, so setting it on the
thread that builds the engine, before torch starts its OpenMP team, covers the
team as well. No privilege is needed to move between SCHED_OTHER and
SCHED_BATCH; a thread under a real-time policy is left as its owner set it.
Elsewhere than Linux this does nothing.
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

log = logging.getLogger("kvserve.engine")


def use_batch_scheduling() -> int | None:
    """Move the calling thread from SCHED_OTHER to SCHED_BATCH. Returns the policy it
    had (to hand back to restore_scheduling), or None when nothing was changed."""
    if not hasattr(os, "SCHED_BATCH"):
        return None
    try:
        previous = os.sched_getscheduler(0)
        if previous != os.SCHED_OTHER:
            return None  # already batch, idle or real-time: the owner's choice stands
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError as exc:  # e.g. a seccomp profile that forbids it: a tuning, not a requirement
        log.debug("SCHED_BATCH not available for the engine thread (%s)", exc)
        return None
    return previous


def restore_scheduling(previous: int | None) -> None:
    if previous is None:
        return
    try:
        os.sched_setscheduler(0, previous, os.sched_param(0))
    except OSError as exc:
        log.debug("could not restore the thread's scheduling policy (%s)", exc)


@contextlib.contextmanager
def batch_scheduling(enabled: bool = True) -> Iterator[None]:
    """SCHED_BATCH for the calling thread for the length of the block (when enabled)."""
    previous = use_batch_scheduling() if enabled else None
    try:
        yield
    finally:
        restore_scheduling(previous)
