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
from kvserve.backend.worker.parallel.rendezvous import (DEFAULT_MASTER_PORT, HeartbeatWatch, node_of_rank, publish,
                                                         ranks_of_node, start_timeout_s)
from kvserve.backend.worker.parallel.wire import encode_config

log = logging.getLogger("kvserve.engine")

# A step's collectives wait at most this long for a rank (a killed rank is noticed at once: its
# socket closes; a stopped one only by this bound). Long enough for a cold first step of a
# large prompt on a loaded CPU.
# KVSERVE_TP_STEP_TIMEOUT_S sets it (read when an engine starts).
DEFAULT_STEP_TIMEOUT_S = 60.0
_STOP_WAIT_S = 5.0


class TensorParallelExecutor:
    """Holds the world's group for rank 0 and the worker processes of its node. With nnodes > 1 the
    other nodes' ranks are started there (`kvserve serve --headless`, launch.py) and only join here."""

    def __init__(self, config, world_size: int, threads_per_rank: int, device: torch.device) -> None:
        self.world_size = world_size  # tensor_parallel_size x pipeline_parallel_size
        self.pipeline_size = config.pipeline_parallel_size
        self.nnodes = config.nnodes
        self.step_timeout_s = float(os.environ.get("KVSERVE_TP_STEP_TIMEOUT_S", DEFAULT_STEP_TIMEOUT_S))
        self.start_timeout_s = start_timeout_s()
        port = config.master_port if config.master_port is not None else (
            DEFAULT_MASTER_PORT if self.nnodes > 1 else 0)
        # One node: the workers reach the store on the loopback. Several: on master_addr (the store
        # listens on every interface); with Ray, on this node's address in the cluster.
        self.use_ray = config.distributed_executor_backend == "ray"
        if self.use_ray:
            from kvserve.backend.worker.parallel.ray_executor import node_address
            self.address = node_address()
        else:
            self.address = config.master_addr if self.nnodes > 1 else "127.0.0.1"
        try:
            self.store = open_store(self.address, port, world_size, True, self.start_timeout_s)
        except RuntimeError as exc:
            raise WorkerLost(f"tensor parallel: cannot hold the rendezvous on port {port}: {exc}") from exc
        worker_config = dataclasses.replace(config, num_threads=threads_per_rank, cpu_reserved_cores=0)
        publish(self.store, encode_config(worker_config), self.step_timeout_s, world_size, self.nnodes)
        # Ray places every worker rank itself (ray_executor.py): none is a local process then.
        self.local_ranks = [] if self.use_ray else list(ranks_of_node(world_size, self.nnodes, 0))[1:]
        self.procs = [subprocess.Popen([sys.executable, "-m", "kvserve.backend.worker.parallel.worker",
                                        "--master-addr", "127.0.0.1", "--master-port", str(self.store.port),
                                        "--rank", str(rank), "--world-size", str(world_size),
                                        "--parent-pid", str(os.getpid())],
                                       # Out of the engine's process group: a signal meant for the
                                       # server (Ctrl-C, a supervisor's SIGTERM) reaches rank 0, which
                                       # stops them in order; they die with it regardless (--parent-pid).
                                       start_new_session=True)
                      for rank in self.local_ranks]
        self.heartbeats = HeartbeatWatch(self.store, [], self.step_timeout_s)  # none to watch while joining
        self.closed = False
        self.ray_ranks = None
        try:
            if self.use_ray:
                from kvserve.backend.worker.parallel.ray_executor import RayRanks
                self.ray_ranks = RayRanks(self.address, self.store.port, world_size, threads_per_rank,
                                          self.start_timeout_s)
            self.group = self._join(device)
        except BaseException:
            self.close(graceful=False)  # nothing ran yet: kill, and tell the other nodes' ranks
            raise
        remote = [rank for rank in range(1, world_size) if rank not in self.local_ranks]
        self.heartbeats = HeartbeatWatch(self.store, remote, self.step_timeout_s)
        log.info("tensor parallel: %d ranks on %d node(s) (local workers pid %s), %d CPU thread(s) each, "
                 "rendezvous on %s:%d", world_size, self.nnodes, [p.pid for p in self.procs], threads_per_rank,
                 self.address, self.store.port)

    def _join(self, device: torch.device) -> RankGroup:
        """The group, once every worker has arrived at the store (each says so after its imports):
        the groups' own rendezvous then waits for no one, so it can keep the step's bound. One that
        exits while starting, or is refused (rendezvous.py), fails the start at once, not after the bound."""
        ranks = range(1, self.world_size)
        deadline = time.monotonic() + self.start_timeout_s
        while not self.store.check([f"arrived/{rank}" for rank in ranks]):
            self.check_alive()
            if self.store.check(["refused"]):
                raise WorkerLost(f"tensor parallel: {self.store.get('refused').decode()}")
            if time.monotonic() > deadline:
                raise WorkerLost(self._missing_message([r for r in ranks if not self.store.check([f"arrived/{r}"])]))
            time.sleep(0.05)
        try:
            return RankGroup(self.store, 0, self.world_size, self.step_timeout_s, device, self.pipeline_size)
        except RuntimeError as exc:
            self.check_alive()
            raise WorkerLost(f"tensor parallel: the rendezvous failed: {exc}") from exc

    def _missing_message(self, missing: list[int]) -> str:
        nodes = sorted({node_of_rank(self.world_size, self.nnodes, r) for r in missing})
        text = (f"tensor parallel: rank(s) {missing} did not arrive within {self.start_timeout_s:.0f} s "
                f"(KVSERVE_TP_START_TIMEOUT_S)")
        if nodes != [0]:
            text += (f"; node(s) {[n for n in nodes if n]} of {self.nnodes} must run `kvserve serve --headless "
                     f"--nnodes {self.nnodes} --node-rank K --master-addr {self.address} --master-port "
                     f"{self.store.port} --tensor-parallel-size {self.world_size}` with the same model")
        return text

    def check_alive(self) -> None:
        """Raise WorkerLost if a local worker process has exited (one waitpid per worker: cheap), or a
        rank on another node stopped beating (read at most once a second)."""
        for rank, proc in zip(self.local_ranks, self.procs):
            code = proc.poll()
            if code is not None:
                raise WorkerLost(f"tensor parallel rank {rank} (pid {proc.pid}) exited with status {code}")
        if self.ray_ranks is not None:
            self.ray_ranks.check()
        lost = self.heartbeats.check()
        if lost is not None:
            raise WorkerLost(lost)

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
            try:
                self.store.set("abort", "1")  # the other nodes' ranks exit on it (rendezvous.py's heartbeat)
            except RuntimeError:
                pass
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
        if self.ray_ranks is not None:  # actors: the same order, through Ray (its placement group freed)
            self.ray_ranks.stop(max(0.0, deadline - time.monotonic()) if graceful else 0.0)
