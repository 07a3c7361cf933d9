"""`--distributed-executor-backend ray`: ranks 1..N-1 run as Ray actors in one placement group, on
whatever nodes the cluster has; rank 0 stays the engine's own process, as with mp.

Ray only places and supervises the ranks. They meet rank 0 through the same TCP rendezvous as
processes do (the store on this node's address, rendezvous.py), and the collectives stay
torch.distributed's (gloo on CPU, NCCL on CUDA): each actor runs the worker loop of worker.py.

The cluster is the one Ray finds: RAY_ADDRESS, or the one `ray start --head` started on this
machine (`ray start --address=HEAD:6379` on the others joins theirs to it); without one, a local
instance is started for this engine, declaring at least one CPU per rank (a rank of a CPU engine
shares the cores like a worker process does).

    placement group (PACK)   bundle 0: this node, rank 0's CPU
                             bundle r: rank r's CPU, anywhere in the cluster
"""
from __future__ import annotations

import argparse
import logging
import os
import time

from kvserve.backend.worker.parallel.distributed import WorkerLost

log = logging.getLogger("kvserve.engine")

_CHECK_EVERY_S = 0.2  # ray.wait's cost kept off most steps


def import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError("distributed_executor_backend: 'ray' needs the ray package, which is not installed "
                         "(pip install 'kvserve[ray]'); or use 'mp' (local worker processes)") from None
    return ray


def node_address() -> str:
    """This node's address as the cluster's other nodes reach it (where the store listens)."""
    ray = import_ray()
    return ray.util.get_node_ip_address()


def _run_rank(master_addr: str, master_port: int, rank: int, world_size: int, threads: int) -> int:
    """Inside the actor: worker.py's loop, until rank 0 says stop (0) or a collective fails."""
    from kvserve.backend.worker.parallel.worker import serve
    node = argparse.Namespace(nnodes=None, model=None, num_threads=threads, heartbeat=True)
    return serve(master_addr, master_port, rank, world_size, node)


class RayRanks:
    """The actors of ranks 1..N-1 and their placement group."""

    def __init__(self, master_addr: str, master_port: int, world_size: int, threads: int,
                 start_timeout_s: float) -> None:
        ray = import_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        if not ray.is_initialized():
            _connect(ray, world_size)
        self.ray = ray
        bundles = [{"CPU": 1.0, f"node:{master_addr}": 0.001}] + [{"CPU": 1.0} for _ in range(world_size - 1)]
        self.group = placement_group(bundles, strategy="PACK")
        try:
            ready, _ = ray.wait([self.group.ready()], timeout=start_timeout_s)
        except Exception as exc:
            self._remove_group()
            raise WorkerLost(f"tensor parallel (ray): the placement group failed: {exc}") from exc
        if not ready:
            self._remove_group()
            raise WorkerLost(f"tensor parallel (ray): the cluster did not grant {world_size} bundles of 1 CPU "
                             f"within {start_timeout_s:.0f} s (ray status shows its resources)")
        runner = ray.remote(num_cpus=1, max_restarts=0)(_RankActor)
        self.actors = [runner.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                           placement_group=self.group, placement_group_bundle_index=rank)).remote()
                       for rank in range(1, world_size)]
        self.runs = [actor.run.remote(master_addr, master_port, rank, world_size, threads)
                     for rank, actor in enumerate(self.actors, start=1)]
        self.next_check = 0.0
        log.info("tensor parallel (ray): ranks 1..%d as actors in placement group %s", world_size - 1,
                 self.group.id.hex())

    def check(self) -> None:
        """Raise WorkerLost when a rank's actor ended or died (at most every 0.2 s)."""
        now = time.monotonic()
        if now < self.next_check:
            return
        self.next_check = now + _CHECK_EVERY_S
        done, _ = self.ray.wait(self.runs, num_returns=1, timeout=0)
        if done:
            rank = self.runs.index(done[0]) + 1
            try:
                status = self.ray.get(done[0], timeout=1)
            except Exception as exc:  # RayActorError: the actor's process died
                status = f"died ({type(exc).__name__})"
            raise WorkerLost(f"tensor parallel rank {rank} (a Ray actor) ended: {status}")

    def stop(self, wait_s: float) -> None:
        """After rank 0 said stop (or gave up): give the actors `wait_s` to end, then kill them and
        free the placement group; no actor is left running."""
        if wait_s > 0:
            self.ray.wait(self.runs, num_returns=len(self.runs), timeout=wait_s)
        for actor in self.actors:
            try:
                self.ray.kill(actor)
            except Exception:
                pass
        self._remove_group()

    def _remove_group(self) -> None:
        from ray.util.placement_group import remove_placement_group
        try:
            remove_placement_group(self.group)
        except Exception:
            pass


class _RankActor:
    def run(self, master_addr: str, master_port: int, rank: int, world_size: int, threads: int) -> int:
        try:
            return _run_rank(master_addr, master_port, rank, world_size, threads)
        except Exception as exc:  # rank 0 sees the actor's run end; the reason goes to its log
            logging.getLogger("kvserve.worker").error("rank %d stops: %s: %s", rank, type(exc).__name__, exc)
            return 1


def _connect(ray, world_size: int) -> None:
    """The cluster of RAY_ADDRESS or of a `ray start` on this machine ("auto" finds both); without
    one, a local instance of this process's own."""
    try:
        ray.init(address=os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=False, configure_logging=False)
        return
    except ConnectionError:
        pass
    ray.init(num_cpus=max(os.cpu_count() or 1, world_size), log_to_driver=False, include_dashboard=False,
             configure_logging=False)
