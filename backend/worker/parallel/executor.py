"""Rank 0's side of a tensor-parallel world: starts the worker processes, meets them through the
TCP rendezvous, hands each step to them, notices one that is gone, and stops them.

Workers are `python -m kvserve.backend.worker.parallel.worker` processes (the same entry point a
second machine runs by hand, docs/parallelism.md): each reads the engine config from the store,
so nothing but the address, the port and its rank travels on its command line.

Only rank 0 samples: the engine (scheduler, sampler, detokenizer) lives in rank 0's process and
every rank ends a forward with the same gathered logits, so one sampler decides the tokens and
they reach the workers in the next step's SchedulerOutput like any other token. Sampling on every
rank with the same generator would agree too, but would have to keep every request's generator,
penalties and grammar state in step on N processes for nothing.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import time

import torch

from kvserve.backend.worker.parallel.distributed import RankGroup, WorkerLost, open_store
from kvserve.backend.worker.parallel.wire import encode_config

log = logging.getLogger("kvserve.engine")

# A step's collectives wait at most this long for a rank (a killed rank is noticed at once: its
# socket closes; a stopped one only by this bound). Long enough for a cold first step of a
# large prompt on a loaded CPU.
# KVSERVE_TP_STEP_TIMEOUT_S sets it (read when an engine starts).
DEFAULT_STEP_TIMEOUT_S = 60.0
START_TIMEOUT_S = 300.0  # the workers' start: interpreter, imports, rendezvous
_STOP_WAIT_S = 5.0


class TensorParallelExecutor:
    """Holds the world's group for rank 0 and the local worker processes."""

    def __init__(self, config, world_size: int, threads_per_rank: int, device: torch.device) -> None:
        self.world_size = world_size  # tensor_parallel_size x pipeline_parallel_size
        self.pipeline_size = config.pipeline_parallel_size
        self.step_timeout_s = float(os.environ.get("KVSERVE_TP_STEP_TIMEOUT_S", DEFAULT_STEP_TIMEOUT_S))
        self.store = open_store("127.0.0.1", 0, world_size, True, START_TIMEOUT_S)
        worker_config = dataclasses.replace(config, num_threads=threads_per_rank, cpu_reserved_cores=0)
        self.store.set("engine_config", encode_config(worker_config))
        self.store.set("step_timeout_s", str(self.step_timeout_s))
        self.procs = [subprocess.Popen([sys.executable, "-m", "kvserve.backend.worker.parallel.worker",
                                        "--master-addr", "127.0.0.1", "--master-port", str(self.store.port),
                                        "--rank", str(rank), "--world-size", str(world_size),
                                        "--parent-pid", str(os.getpid())],
                                       # Out of the engine's process group: a signal meant for the
                                       # server (Ctrl-C, a supervisor's SIGTERM) reaches rank 0, which
                                       # stops them in order; they die with it regardless (--parent-pid).
                                       start_new_session=True)
                      for rank in range(1, world_size)]
        self.closed = False
        try:
            self.group = self._join(device)
        except BaseException:
            self.close()
            raise
        log.info("tensor parallel: %d ranks (workers pid %s), %d CPU thread(s) each, rendezvous on 127.0.0.1:%d",
                 world_size, [p.pid for p in self.procs], threads_per_rank, self.store.port)

    def _join(self, device: torch.device) -> RankGroup:
        """The group, once every worker has arrived at the store (each says so after its imports):
        the groups' own rendezvous then waits for no one, so it can keep the step's bound. One that
        exits while starting fails the start at once, not after START_TIMEOUT_S."""
        keys = [f"arrived/{rank}" for rank in range(1, self.world_size)]
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.store.check(keys):
            self.check_alive()
            if time.monotonic() > deadline:
                raise WorkerLost(f"tensor parallel: the workers did not arrive within {START_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
        try:
            return RankGroup(self.store, 0, self.world_size, self.step_timeout_s, device, self.pipeline_size)
        except RuntimeError as exc:
            self.check_alive()
            raise WorkerLost(f"tensor parallel: the rendezvous failed: {exc}") from exc

    def check_alive(self) -> None:
        """Raise WorkerLost if a local worker process has exited (one waitpid per worker: cheap)."""
        for rank, proc in enumerate(self.procs, start=1):
            code = proc.poll()
            if code is not None:
                raise WorkerLost(f"tensor parallel rank {rank} (pid {proc.pid}) exited with status {code}")

    def send(self, kind: str, out) -> None:
        """Hand the workers what the runner is about to do with `out` (a SchedulerOutput)."""
        self.check_alive()
        self.group.send_object((kind, out))

    def close(self, graceful: bool = True) -> None:
        """Stop the workers: ask, then wait, then kill; no rank is left running. Not graceful: kill."""
        if self.closed:
            return
        self.closed = True
        group = getattr(self, "group", None)
        if not graceful:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()
        elif group is not None and all(p.poll() is None for p in self.procs):
            try:
                group.send_object(None)
            except WorkerLost:
                pass
        deadline = time.monotonic() + _STOP_WAIT_S
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

