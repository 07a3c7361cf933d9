"""Wall time of each engine step, split into the native decode step, the logits projection and the
rest (step_overhead.py's split), for served_step.py: in the served host (through sitecustomize) and
offline (imported by served_step.py itself). Not installed.

Each step's row is `start end native logits` (seconds, time.monotonic(), comparable across processes
on Linux). Offline the rows stay in `rows`; in a server they go to the file, written out every
FLUSH_STEPS steps, so a server that is killed loses at most that many.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from kvserve.loadtests.studies.step_overhead import LOGITS_KERNELS, wrap_step_kernels

FLUSH_STEPS = 64


class StepLog:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self.rows: list[tuple[float, float, float, float]] = []
        self._pending: list[str] = []
        self._spent = {"native": 0.0, "logits": 0.0}

    def timed_step(self, step: Callable[..., Any]) -> Callable[..., Any]:
        log = self

        def wrapper(engine: Any, *args: Any, **kwargs: Any) -> Any:
            log._spent["native"] = log._spent["logits"] = 0.0
            start = time.monotonic()
            try:
                return step(engine, *args, **kwargs)
            finally:
                log.record((start, time.monotonic(), log._spent["native"], log._spent["logits"]))
        return wrapper

    def record(self, row: tuple[float, float, float, float]) -> None:
        if self.path is None:
            self.rows.append(row)
            return
        self._pending.append(" ".join(f"{v:.6f}" for v in row))
        if len(self._pending) >= FLUSH_STEPS:
            self.flush()

    def flush(self) -> None:  # on the engine thread, as record(), and only with a path
        lines, self._pending = self._pending, []
        if lines:
            with open(self.path, "a") as f:
                f.write("\n".join(lines) + "\n")


def install(engine_cls: Any, cpu_native: Any, path: str | None) -> StepLog:
    """Wrap engine_cls.step and cpu_native's step kernels; returns the log they write to."""
    log = StepLog(path)
    wrap_step_kernels(cpu_native, log._spent)
    engine_cls.step = log.timed_step(engine_cls.step)
    return log


def read_log(path: str) -> list[tuple[float, float, float, float]]:
    rows = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 4:
                rows.append(tuple(float(p) for p in parts))
    return rows  # type: ignore[return-value]
