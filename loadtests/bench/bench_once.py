"""One `kvserve bench` run from inside another benchmark script.

Parses `kvserve bench` arguments, builds the dataset against the server (its
own tokenizer, so prompt lengths are exact), warms the server up with prompts
unlike the dataset's, then runs the load and returns the bench metrics as the
`--json` document has them.
"""
from __future__ import annotations

from typing import Callable

from kvserve.loadtests.bench.bench_args import build_parser as bench_parser
from kvserve.loadtests.bench.bench_args import make_dataset, validate
from kvserve.loadtests.bench.bench_cli import prepare
from kvserve.loadtests.bench.bench_request import BenchRequest
from kvserve.loadtests.bench.client import EndpointConfig
from kvserve.loadtests.bench.bench_metrics import compute_metrics
from kvserve.loadtests.bench.runner import LoadConfig, run_load


async def bench_once(url: str, bench_argv: list[str], on_warm: Callable[[], None] = lambda: None) -> dict[str, object]:
    """`on_warm` is called after the warm-up, just before the measured load starts."""
    args = bench_parser().parse_args(["--base-url", url, "--disable-tqdm", *bench_argv])
    validate(args)
    dataset = make_dataset(args)
    model, requests, _ = await prepare(args, dataset)
    endpoint = EndpointConfig(base_url=url, model=model, ignore_eos=True, temperature=0.0)
    # Lazy initialisation is nobody's steady state; prompts unlike the dataset's, so no cache is warmed.
    warm_up = [BenchRequest(i, f"warm up {i} " * 4, 0, 8) for i in range(8)]
    warm = await run_load(warm_up, endpoint, LoadConfig(max_concurrency=8, show_progress=False))
    if not any(r.success for r in warm.records):  # (a random model may stream only unprintable tokens)
        raise RuntimeError(f"warm-up failed: {warm.records[0].error}")
    on_warm()
    load = LoadConfig(max_concurrency=args.max_concurrency, seed=args.seed, show_progress=False)
    result = await run_load(requests, endpoint, load)
    metrics = compute_metrics(result.records, result.duration, max_concurrent=result.max_in_flight)
    return metrics.to_dict()
