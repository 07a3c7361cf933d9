"""A node other than the head: starts this node's ranks as worker processes, which join the head's
rendezvous, and stays with them (what `kvserve serve --headless` runs).

    python -m kvserve.backend.worker.parallel.launch --nnodes 2 --node-rank 1 --master-addr HEAD \\
        --master-port 29501 --world-size 3 [--model PATH] [--cpu-reserved-cores K]

It runs nothing of the engine itself (no scheduler, no gateway): the head sends each step to every
rank. It exits 0 when all its ranks do (the head stopped them), and non-zero as soon as one fails
(the head went away, refused this node, or a rank died), after stopping the others: a supervisor
restarts the node, as it restarts the head. SIGTERM or SIGINT stops its ranks and exits 0 (the head
then loses them and fails, which is what stopping one node of a world means).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from kvserve.backend.worker.parallel.rendezvous import DEFAULT_MASTER_PORT, ranks_of_node

_STOP_WAIT_S = 5.0


def threads_per_rank(local_ranks: int, reserved: int) -> int:
    """This machine's cores (those this process may use) less the reserved ones, shared by its ranks."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, (cores - reserved) // local_ranks)


def worker_command(args: argparse.Namespace, rank: int, threads: int) -> list[str]:
    command = [sys.executable, "-m", "kvserve.backend.worker.parallel.worker", "--master-addr", args.master_addr,
               "--master-port", str(args.master_port), "--rank", str(rank), "--world-size", str(args.world_size),
               "--nnodes", str(args.nnodes), "--parent-pid", str(os.getpid()), "--num-threads", str(threads),
               "--heartbeat"]
    return command + (["--model", args.model] if args.model else [])


def _stop(procs: list[subprocess.Popen], sig: int) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(sig)
    deadline = time.monotonic() + _STOP_WAIT_S
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def supervise(procs: list[subprocess.Popen]) -> int:
    """Wait for the ranks: 0 once all exit 0; the first failure stops the rest and is returned."""
    while True:
        codes = [proc.poll() for proc in procs]
        failed = next((c for c in codes if c not in (None, 0)), None)
        if failed is not None:
            _stop(procs, signal.SIGKILL)
            return 1
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.2)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvserve-node", description=__doc__.split("\n\n")[0])
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--node-rank", type=int, required=True)
    p.add_argument("--master-addr", required=True)
    p.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--model", default=None, help="this node's path to the head's model (default: the head's path)")
    p.add_argument("--cpu-reserved-cores", type=int, default=0)
    return p


def check(args: argparse.Namespace) -> range:
    """This node's ranks; ValueError naming the flag when the numbers do not make a world."""
    if args.nnodes < 2:
        raise ValueError(f"--nnodes: a headless node is one of several nodes, got {args.nnodes}")
    if not 0 < args.node_rank < args.nnodes:
        raise ValueError(f"--node-rank: a headless node is one of 1..{args.nnodes - 1} (node 0 is the head, "
                         f"which runs `kvserve serve` without --headless), got {args.node_rank}")
    if not 0 < args.master_port < 65536:
        raise ValueError(f"--master-port: must be a TCP port in [1, 65535], got {args.master_port}")
    if args.cpu_reserved_cores < 0:
        raise ValueError(f"--cpu-reserved-cores: must be >= 0, got {args.cpu_reserved_cores}")
    return ranks_of_node(args.world_size, args.nnodes, args.node_rank)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        ranks = check(args)
    except ValueError as exc:
        print(f"kvserve node: error: {exc}", file=sys.stderr)
        return 2
    threads = threads_per_rank(len(ranks), args.cpu_reserved_cores)
    procs: list[subprocess.Popen] = []
    stopping = []

    def on_signal(signum: int, _frame) -> None:
        stopping.append(signum)
        _stop(procs, signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # The ranks stay in this process group: a signal to the node's tree reaches every process of it.
    procs.extend(subprocess.Popen(worker_command(args, rank, threads)) for rank in ranks)
    print(f"kvserve node {args.node_rank} of {args.nnodes}: ranks {ranks.start}..{ranks.stop - 1} of "
          f"{args.world_size} ({threads} CPU thread(s) each), joining {args.master_addr}:{args.master_port}",
          flush=True)
    code = supervise(procs)
    return 0 if stopping else code


if __name__ == "__main__":
    sys.exit(main())
