"""What other work on the same cores costs the engine: offline throughput with
and without a CPU-busy process beside it.

    python -m kvserve.loadtests.studies.contention --busy 0.10 --rounds 4 --json contention.json

Serving puts work next to the engine: the gateway, the Triton host's gRPC and
response threads, and (in a benchmark) the client. On a machine whose cores
the engine's OpenMP threads already fill, that work runs by preempting one of
them, and a parallel region lasts as long as its slowest thread. This measures
that price directly: each round runs the same `LLM.generate` workload (the
`kvserve bench --compare` one, under new token ids each run so the prefix cache
never helps) alone and then with a separate process that, every `--period-ms`,
keeps one core busy for `--busy` of the period, alternating which goes first.
The busy process's own CPU time is measured, so the report can say what share
of the machine it took and what share of throughput that cost.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from kvserve.loadtests.compare.compare_model import ensure_bench_model, prompt_vocab_size
from kvserve.loadtests.compare.compare_prompts import CompareRequest, relabel, token_prompts
from kvserve.loadtests.bench.datasets import LognormalDataset
from kvserve.loadtests.bench.report import write_json
from kvserve.loadtests.studies.thread_cpu import stat_cpu_s


def busy_loop(stop: Any, busy: float, period_s: float) -> None:
    """Spin for busy * period, sleep the rest, until `stop` is set."""
    spin = busy * period_s
    while not stop.is_set():
        started = time.perf_counter()
        while time.perf_counter() - started < spin:
            pass
        time.sleep(max(0.0, period_s - (time.perf_counter() - started)))


def timed_generate(llm: Any, requests: list[CompareRequest]) -> tuple[float, int]:
    """Duration and output tokens of one `kvserve bench --compare` baseline (c) run."""
    from kvserve.loadtests.compare.baseline_kvserve import run_offline

    return run_offline(llm, requests).duration, sum(r.output_len for r in requests)


def run_arm(llm: Any, requests: list[CompareRequest], busy: float, period_s: float) -> dict[str, float]:
    if busy <= 0:
        duration, tokens = timed_generate(llm, requests)
        return {"duration_s": duration, "output_throughput": tokens / duration, "busy_cpu_s": 0.0}
    ctx = mp.get_context("spawn")  # a fresh interpreter: no copy of the engine, no inherited OpenMP team
    stop = ctx.Event()
    proc = ctx.Process(target=busy_loop, args=(stop, busy, period_s), daemon=True)
    proc.start()
    time.sleep(0.5)  # past its start-up
    try:
        stat = Path(f"/proc/{proc.pid}/stat")
        before = stat_cpu_s(stat)
        duration, tokens = timed_generate(llm, requests)
        busy_cpu = stat_cpu_s(stat) - before
    finally:
        stop.set()
        proc.join(10)
    return {"duration_s": duration, "output_throughput": tokens / duration, "busy_cpu_s": busy_cpu}


def summarize(rounds: list[dict[str, dict[str, float]]], cores: int) -> dict[str, float]:
    ratios = [r["busy"]["output_throughput"] / r["alone"]["output_throughput"] for r in rounds]
    busy_share = statistics.median(r["busy"]["busy_cpu_s"] / (r["busy"]["duration_s"] * cores) for r in rounds)
    loss = 1.0 - statistics.median(ratios)
    return {"median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
            "busy_share_of_machine": busy_share,
            # Throughput lost per unit of machine time taken: 1 would mean the engine only lost the cycles it gave up.
            "loss_per_share": loss / busy_share if busy_share > 0 else float("nan")}


def run(opts: argparse.Namespace) -> dict[str, Any]:
    from kvserve.loadtests.compare.baseline_kvserve import make_llm

    model_dir = ensure_bench_model(opts.model)
    dataset = LognormalDataset(num_prompts=opts.num_prompts, input_len=opts.input_len, range_ratio=opts.range_ratio,
                               output_median=opts.output_median, output_max=opts.output_max, seed=opts.seed)
    vocab = prompt_vocab_size(model_dir)
    requests = token_prompts(dataset, vocab)
    llm = make_llm(model_dir, {})
    cores = len(os.sched_getaffinity(0))
    rounds: list[dict[str, dict[str, float]]] = []
    for i in range(opts.rounds):
        order = ("alone", "busy") if i % 2 == 0 else ("busy", "alone")
        result: dict[str, dict[str, float]] = {}
        for j, arm in enumerate(order):
            prompts = relabel(list(requests), 2 * i + j + 1, vocab)
            result[arm] = run_arm(llm, prompts, opts.busy if arm == "busy" else 0.0, opts.period_ms / 1000)
        rounds.append(result)
        ratio = result["busy"]["output_throughput"] / result["alone"]["output_throughput"]
        print(f"round {i + 1}/{opts.rounds} ({order[0]} first): alone "
              f"{result['alone']['output_throughput']:.1f} tok/s, busy {result['busy']['output_throughput']:.1f} "
              f"tok/s, ratio {ratio:.3f}", file=sys.stderr)
    return {"model": model_dir, "cores": cores, "busy": opts.busy, "period_ms": opts.period_ms,
            "num_prompts": opts.num_prompts, "rounds": rounds, "summary": summarize(rounds, cores)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.studies.contention", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model folder (default: the benchmark model, made if missing)")
    p.add_argument("--busy", type=float, default=0.10, help="share of one core the busy process takes (0-1)")
    p.add_argument("--period-ms", type=float, default=20.0, help="its busy/sleep cycle")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--num-prompts", type=int, default=64)
    # The workload of `kvserve bench --compare` in BENCHMARKS.md §2.
    p.add_argument("--input-len", type=int, default=160)
    p.add_argument("--range-ratio", type=float, default=0.6)
    p.add_argument("--output-median", type=int, default=64)
    p.add_argument("--output-max", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    if not sys.platform.startswith("linux"):
        print("contention reads /proc: Linux only", file=sys.stderr)
        return 2
    if not 0 < opts.busy <= 1 or opts.rounds < 1 or opts.num_prompts < 1 or opts.period_ms <= 0:
        print("contention: need 0 < --busy <= 1, --rounds >= 1, --num-prompts >= 1, --period-ms > 0", file=sys.stderr)
        return 2
    doc = run(opts)
    s = doc["summary"]
    print(f"busy process took {100 * s['busy_share_of_machine']:.1f} % of the machine ({doc['cores']} cores); "
          f"engine throughput with it / alone: median {s['median_ratio']:.3f} "
          f"(range {s['min_ratio']:.3f}-{s['max_ratio']:.3f}); "
          f"throughput lost per unit of machine taken: {s['loss_per_share']:.2f}")
    if opts.json_path:
        print(f"wrote {write_json(doc, opts.json_path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
