"""The collective cost of tensor parallelism on this machine: microseconds per gloo all-reduce of
one layer's activation [tokens, hidden] over `world` local processes (a Llama layer does two).

    python loadtests/studies/parallel/tp_allreduce.py --world 3 --hidden 576

Absolute times, for the record (BENCHMARKS.md section on tensor parallelism): the sizes are
interleaved round by round, every process on one thread, after a warm-up.
"""
from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import time

import torch
import torch.distributed as dist

TOKENS = (1, 16, 256)


def _rank(rank: int, world: int, port: int, hidden: int, rounds: int, out) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, datetime.timedelta(seconds=60))
    pg = dist.ProcessGroupGloo(store, rank, world, datetime.timedelta(seconds=60))
    xs = {t: torch.randn(t, hidden) for t in TOKENS}
    times = {t: [] for t in TOKENS}
    for r in range(rounds + 5):
        for t in TOKENS:
            start = time.perf_counter()
            for _ in range(20):
                pg.allreduce([xs[t]]).wait()
            if r >= 5:
                times[t].append((time.perf_counter() - start) / 20)
    if rank == 0:
        out.put({t: sorted(v)[len(v) // 2] * 1e6 for t, v in times.items()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--port", type=int, default=29533)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, args.world, args.port, args.hidden, args.rounds, out))
             for r in range(args.world)]
    for p in procs:
        p.start()
    result = out.get()
    for p in procs:
        p.join()
    for t, us in result.items():
        print(f"world {args.world}, [{t}, {args.hidden}] float32: {us:.0f} us per all-reduce (median), "
              f"{2 * us:.0f} us per layer")


if __name__ == "__main__":
    main()
