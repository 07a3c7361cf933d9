"""A compressed KV cache served over HTTP on long contexts: TPOT with each --kv-cache-dtype against
the first one given, on #30's long-context workload (prompts of 3,000-6,000 tokens, 128 out,
concurrency 8).

    python -m kvserve.loadtests.studies.serving.kv_dtype_served --model GGUF_OR_FOLDER \
        [--kv-cache-dtypes float32,fp8] [--rounds 2] [--json FILE]

One `kvserve serve` per dtype runs at once, each with the same --kv-cache-memory; the rounds
interleave them (A, B, then B, A, ...), so a loaded machine slows both alike. Each round sends
fresh prompts (the dataset's seed is the round's), the same ones to every server, so no prefix
cache hit helps one side. Requests go through kvserve bench (bench_once: exact prompt lengths from
the server's tokenizer, a warm-up first). Reported per dtype: mean TPOT (the issue's figure), median
ITL (a decode step with no prompt chunk beside it), TTFT and output throughput, each as a ratio of
the first dtype's (of the medians over rounds, and round by round); preemptions from the server's
counter.
One-off measurement, not installed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

from kvserve.loadtests.bench.bench_once import bench_once
from kvserve.loadtests.bench.server_api import metric_sums
from kvserve.loadtests.compare.peers.peer_commands import Command, Settings, kvserve_server
from kvserve.loadtests.compare.peers.peer_run import ServerProcess, free_port

_SERVED_NAME = "kv-dtype-served"
_FIGURES = ("mean_tpot_ms", "median_itl_ms", "mean_ttft_ms", "output_throughput")


_PREEMPTIONS = "kvserve:num_preemptions_total"


def _server(args: argparse.Namespace, dtype: str, port: int) -> Command:
    """The peer harness's kvserve command (its KV budget and float32), with this dtype and length."""
    settings = Settings(hf_model=Path(args.model), gguf_model=None, served_name=_SERVED_NAME,
                        vllm_kvcache_gib=args.kv_cache_gib,
                        kvserve_args=("--kv-cache-dtype", dtype, "--max-model-len", str(args.max_model_len)))
    return kvserve_server(settings, port, str(Path(sys.executable).parent / "kvserve"))


def _bench_argv(args: argparse.Namespace, seed: int) -> list[str]:
    return ["--model", _SERVED_NAME, "--endpoint-type", "completions", "--dataset-name", "random",
            "--random-input-len", str(args.input_len), "--random-range-ratio", str(args.range_ratio),
            "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
            "--max-concurrency", str(args.concurrency), "--seed", str(seed), "--ignore-eos"]


async def _rounds(args: argparse.Namespace, urls: dict[str, str]) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {dtype: [] for dtype in urls}
    for rnd in range(args.rounds):
        order = list(urls) if rnd % 2 == 0 else list(reversed(urls))
        for dtype in order:
            metrics = await bench_once(urls[dtype], _bench_argv(args, seed=rnd))
            runs[dtype].append({k: metrics[k] for k in (*_FIGURES, "completed", "failed", "total_input_tokens")})
            print(f"round {rnd} {dtype}: " + ", ".join(f"{k} {metrics[k]:.1f}" for k in _FIGURES), flush=True)
    return runs


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Each dtype's figures (the median over rounds), their ratios to the first dtype's, and the
    ratios round by round (a round's two runs were measured side by side: the pairs to read when one
    round of one side was slowed by the machine)."""
    base = next(iter(runs))
    medians = {dtype: {k: statistics.median(r[k] for r in rows) for k in _FIGURES} for dtype, rows in runs.items()}
    return {dtype: {**medians[dtype], **{f"{k}_vs_{base}": medians[dtype][k] / medians[base][k] for k in _FIGURES},
                    **{f"{k}_vs_{base}_by_round": [r[k] / b[k] for r, b in zip(rows, runs[base])] for k in _FIGURES},
                    "rounds": rows}
            for dtype, rows in runs.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--kv-cache-dtypes", default="float32,fp8", help="comma-separated; the first is the baseline")
    p.add_argument("--kv-cache-gib", type=int, default=4, help="--kv-cache-memory of every server, in GiB")
    p.add_argument("--max-model-len", type=int, default=6400)
    p.add_argument("--input-len", type=int, default=4500)
    p.add_argument("--range-ratio", type=float, default=1 / 3, help="prompt lengths uniform in len*(1 -+ r)")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    dtypes = args.kv_cache_dtypes.split(",")
    servers = {}
    try:
        for dtype in dtypes:
            port = free_port()
            servers[dtype] = ServerProcess.start(f"kvserve {dtype}", _server(args, dtype, port), port,
                                                 args.log_dir / f"kv_dtype_served_{dtype}.log")
        for server in servers.values():
            server.wait_ready(_SERVED_NAME, args.startup_timeout)
        urls = {dtype: server.base_url for dtype, server in servers.items()}
        runs = asyncio.run(_rounds(args, urls))
        result = summarize(runs)
        for dtype, url in urls.items():
            counters = metric_sums(f"{url}/metrics", (_PREEMPTIONS,))
            result[dtype]["preemptions"] = counters.get(_PREEMPTIONS, float("nan"))
    finally:
        for server in servers.values():
            server.stop()
    for dtype, s in result.items():
        print(f"{dtype:10s} " + "  ".join(f"{k} {s[k]:.1f} ({s[f'{k}_vs_{dtypes[0]}']:.3f}x)" for k in _FIGURES)
              + f"  preemptions {s['preemptions']:.0f}")
        for k in ("mean_tpot_ms", "median_itl_ms"):
            print(f"{'':10s} {k} by round: " + ", ".join(f"{x:.3f}x" for x in s[f"{k}_vs_{dtypes[0]}_by_round"]))
    if args.json:
        args.json.write_text(json.dumps({"config": vars(args) | {"log_dir": str(args.log_dir),
                                                               "json": str(args.json)},
                                         "results": result}, indent=2))


if __name__ == "__main__":
    main()
