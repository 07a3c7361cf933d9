"""A tensor-parallel worker process (ranks 1..N-1): its shard of the weights and of the KV cache,
and a loop that runs the forward on what rank 0 sends each step.

    python -m kvserve.backend.worker.parallel.worker --master-addr A --master-port P --rank R \\
        --world-size N [--parent-pid PID]

Rank 0's executor starts it on the same machine; on another machine it is started by hand with
rank 0's address (docs/parallelism.md). It exits when rank 0 says stop (status 0), when rank 0's
process goes away, or when a step fails (status 1): rank 0 then sees a lost worker and fails.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time

log = logging.getLogger("kvserve.worker")


def _watch_parent(pid: int) -> None:
    """A local worker dies with the engine's process, even one killed with SIGKILL."""
    while True:
        time.sleep(0.5)
        if os.getppid() != pid:
            os._exit(1)


def serve(master_addr: str, master_port: int, rank: int, world_size: int, node: argparse.Namespace) -> int:
    from kvserve.backend.worker.model_runner import InjectedFault, ModelRunner
    from kvserve.backend.worker.parallel import rendezvous
    from kvserve.backend.worker.parallel.distributed import RankGroup, open_store

    def connect():
        return open_store(master_addr, master_port, world_size, False, rendezvous.start_timeout_s())

    store = connect()
    rendezvous.claim_rank(store, rank, world_size, node.nnodes)
    config = rendezvous.read_config(store, rank, node.model, node.num_threads)
    timeout_s = float(store.get("step_timeout_s").decode())
    if node.heartbeat:
        rendezvous.start_heartbeat(connect, rank)
    store.set(f"arrived/{rank}", "1")  # rank 0 builds the groups once every rank has
    group = RankGroup(store, rank, world_size, timeout_s, _device(config.device), config.pipeline_parallel_size)
    runner = ModelRunner(config, group=group)
    while True:
        message = group.receive_object()
        if message is None:
            return 0
        kind, out = message
        if kind == "step":
            try:
                runner.execute(out)
            except InjectedFault:  # the test hook fails every rank at the same step, before any collective
                pass
        elif kind == "tables":
            runner.update_block_tables(out)
        elif kind == "reset":
            runner.reset_block_tables()


def _device(name: str):
    from kvserve.backend.worker.model_runner import resolve_device
    return resolve_device(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvserve-worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, default=None)
    # Set by another node's launcher (launch.py): checked against the head's world, this node's model
    # path and threads, and heartbeats (the head cannot see another machine's processes).
    parser.add_argument("--nnodes", type=int, default=None)
    parser.add_argument("--model", default=None)
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--heartbeat", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"rank {args.rank}: %(levelname)s %(message)s")
    if args.parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()
    try:
        return serve(args.master_addr, args.master_port, args.rank, args.world_size, args)
    except Exception as exc:  # rank 0 notices the closed connection and fails the engine
        log.error("worker rank %d stops: %s: %s", args.rank, type(exc).__name__, exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
