"""What prefix caching costs when nothing hits: caching on vs off, served.

    python -m kvserve.loadtests.studies.cache_ab --rounds 8 --json cache_ab.json

Two `kvserve serve` processes on the same model, one with prefix caching (the
default) and one with `--no-enable-prefix-caching`, both started before the
first round and kept up to the last, so neither pays start-up or warm-up in a
measured round. Each round runs the same `kvserve bench` workload (random,
unshared prompts; a new seed per round, so the caching server has never seen
a round's prompts) against one server and then the other, alternating which
goes first. On a small shared machine the speed drifts by 10-20 % over
minutes; pairing runs seconds apart and alternating their order cancels that
drift, which separate server starts do not.

The caching server's own counters (kvserve:prefix_cache_{hits,queries}_total,
read before and after each measured run) show that its hits really were 0.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from contextlib import ExitStack

from kvserve.loadtests.compare.baseline_kvserve import ServeProcess
from kvserve.loadtests.bench.bench_once import bench_once
from kvserve.loadtests.compare.compare_model import ensure_bench_model
from kvserve.loadtests.bench.report import write_json
from kvserve.loadtests.bench.server_api import metric_sums

ARMS = {"on": [], "off": ["--no-enable-prefix-caching"]}


_HITS, _QUERIES = "kvserve:prefix_cache_hits_total", "kvserve:prefix_cache_queries_total"


def _cache_counters(base_url: str) -> tuple[float, float]:
    """From the gateway's /metrics, which includes its backends'."""
    sums = metric_sums(f"{base_url}/metrics", (_HITS, _QUERIES))
    return sums.get(_HITS, 0.0), sums.get(_QUERIES, 0.0)


def measure(base_url: str, bench_argv: list[str]) -> dict[str, float]:
    before: list[tuple[float, float]] = []
    metrics = asyncio.run(bench_once(base_url, bench_argv, lambda: before.append(_cache_counters(base_url))))
    hits, queries = _cache_counters(base_url)
    return {"output_throughput": float(metrics["output_throughput"]),  # type: ignore[arg-type]
            "duration_s": float(metrics["duration"]),  # type: ignore[arg-type]
            "completed": float(metrics["completed"]),  # type: ignore[arg-type]
            "failed": float(metrics["failed"]),  # type: ignore[arg-type]
            "cached_tokens": hits - before[0][0], "prompt_tokens_looked_up": queries - before[0][1]}


def summarize(rounds: list[dict[str, dict[str, float]]]) -> dict[str, float]:
    ratios = [r["on"]["output_throughput"] / r["off"]["output_throughput"] for r in rounds]
    return {"median_ratio": statistics.median(ratios), "mean_ratio": statistics.fmean(ratios),
            "min_ratio": min(ratios), "max_ratio": max(ratios),
            # Whole-run view: the same token count in both arms, so this is the ratio of total times.
            "total_time_ratio": sum(r["off"]["duration_s"] for r in rounds) / sum(r["on"]["duration_s"] for r in rounds),
            "cached_tokens_on": sum(r["on"]["cached_tokens"] for r in rounds),
            "failed": sum(r[arm]["failed"] for r in rounds for arm in ARMS)}


def run(opts: argparse.Namespace) -> dict[str, object]:
    model_dir = ensure_bench_model(opts.model)
    serve_flags = ["--max-model-len", str(opts.max_model_len)] if opts.max_model_len else []
    rounds: list[dict[str, dict[str, float]]] = []
    with ExitStack() as stack:
        servers = {arm: stack.enter_context(ServeProcess(model_dir, [*serve_flags, *flags], opts.startup_timeout))
                   for arm, flags in ARMS.items()}
        for i in range(opts.rounds):
            argv = ["--dataset-name", "random", "--num-prompts", str(opts.num_prompts),
                    "--random-input-len", str(opts.input_len), "--random-output-len", str(opts.output_len),
                    "--seed", str(opts.seed + i)]
            order = ("on", "off") if i % 2 == 0 else ("off", "on")
            row = {arm: measure(servers[arm].base_url, argv) for arm in order}
            rounds.append(row)
            print(f"round {i + 1}: on {row['on']['output_throughput']:.1f} / off {row['off']['output_throughput']:.1f} "
                  f"output tok/s = {row['on']['output_throughput'] / row['off']['output_throughput']:.3f} "
                  f"(cached tokens on: {row['on']['cached_tokens']:.0f}; {order[0]} ran first)", flush=True)
    summary = summarize(rounds)
    print(f"on/off output throughput: median {summary['median_ratio']:.3f}, mean {summary['mean_ratio']:.3f}, "
          f"range {summary['min_ratio']:.3f}-{summary['max_ratio']:.3f}; total time off/on "
          f"{summary['total_time_ratio']:.3f}; cached tokens (caching on) {summary['cached_tokens_on']:.0f}; "
          f"failed {summary['failed']:.0f}")
    return {"model": model_dir, "config": vars(opts), "rounds": rounds, "summary": summary}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.studies.cache_ab", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=None, help="model folder (default: the benchmark model, made if missing)")
    p.add_argument("--rounds", type=int, default=8, help="alternating on/off pairs")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=None, help="passed to both servers")
    p.add_argument("--seed", type=int, default=1, help="seed of round 1; round i uses seed + i - 1")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    if opts.rounds < 1:
        print("cache_ab: --rounds must be at least 1", file=sys.stderr)
        return 2
    doc = run(opts)
    if opts.json_path:
        print(f"wrote {write_json(doc, opts.json_path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
