"""`kvserve bench`: a serving benchmark in the manner of `vllm bench serve`.

    kvserve bench --base-url http://127.0.0.1:8000 --dataset-name random \\
        --random-input-len 1024 --random-output-len 128 --num-prompts 500 \\
        --request-rate 10 --goodput ttft:500 tpot:50 --json out.json --plot out.png

With `--compare` the same workload runs against transformers (one at a time,
static batches) and kvserve (offline and through `kvserve serve`) side by
side; see compare_cli.py.

Steps: discover the model, build prompts (exact token counts through the
server's /tokenize when it has one), send them paced and capped, then print
the vLLM-style table and write JSON/plot. Exit status: 0 when at least one
request succeeded, 1 when all failed, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import sys

import aiohttp

from kvserve.loadtests.bench.bench_args import build_parser, make_dataset, validate
from kvserve.loadtests.bench.bench_request import BenchRequest
from kvserve.loadtests.bench.client import EndpointConfig
from kvserve.loadtests.bench.datasets import Dataset
from kvserve.loadtests.bench.local_tokenizer import load_counter
from kvserve.loadtests.bench.bench_metrics import compute_metrics, parse_goodput, parse_percentiles
from kvserve.loadtests.bench.prompt_builder import ExactPromptBuilder, PromptBuilder, WordPromptBuilder
from kvserve.loadtests.bench.report import build_document, format_table, write_json
from kvserve.loadtests.bench.runner import LoadConfig, RunResult, run_load
from kvserve.loadtests.bench.server_api import auth_headers, first_model, probe_tokenize
from kvserve.loadtests.bench.timeline import build_timeline


async def prepare(args: argparse.Namespace, dataset: Dataset) -> tuple[str, list[BenchRequest], bool]:
    """Model name, the prompts, and whether their lengths are exact."""
    base = args.base_url.rstrip("/")
    headers = auth_headers(args.api_key)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=args.request_timeout)) as session:
        model = args.model or await first_model(session, base, headers)
        builder: PromptBuilder = WordPromptBuilder()
        if args.tokenizer is not None:
            exact = ExactPromptBuilder(load_counter(args.tokenizer))
            await exact.calibrate()
            builder = exact
        elif not args.no_tokenize:
            counter = await probe_tokenize(session, base, model, args.endpoint_type == "chat", headers)
            if counter is not None:
                exact = ExactPromptBuilder(counter)
                await exact.calibrate()
                builder = exact
            else:
                print("kvserve bench: server has no /tokenize; prompt lengths are word-count estimates",
                      file=sys.stderr)
        requests = await dataset.sample(builder)
    return model, requests, builder.exact


def _config_dict(args: argparse.Namespace, model: str) -> dict[str, object]:
    config = {k: v for k, v in vars(args).items() if k not in ("api_key",)}
    config["model"] = model
    config["api_key_set"] = bool(args.api_key)
    return config


def report(args: argparse.Namespace, dataset: Dataset, model: str, exact: bool, result: RunResult) -> int:
    percentiles = parse_percentiles(args.metric_percentiles)
    slos = parse_goodput(args.goodput)
    metrics = compute_metrics(result.records, result.duration, percentiles, slos or None, result.max_in_flight)
    print(format_table(metrics, args.max_concurrency, args.request_rate))
    timeline = build_timeline(result.records, result.duration)
    if args.json_path:
        doc = build_document(
            metrics,
            _config_dict(args, model),
            {**dataset.describe(), "exact_prompt_lengths": exact},
            extra={
                "goodput_slos_ms": slos,
                "peak_output_throughput": timeline.peak_output_tokens_per_s,
                "usage_reported": all(r.usage_reported for r in result.records if r.success),
            },
            records=result.records if args.save_detailed else None,
        )
        print(f"wrote {write_json(doc, args.json_path)}")
    if args.plot:
        from kvserve.loadtests.bench.plots import write_plot

        rate = "inf" if math.isinf(args.request_rate) else f"{args.request_rate:g}"
        title = f"{model} | {dataset.name} | {len(result.records)} req @ {rate} req/s"
        print(f"wrote {write_plot(result.records, result.duration, args.plot, title)}")
    if metrics.completed == 0:
        print("kvserve bench: every request failed; see the errors above", file=sys.stderr)
        return 1
    return 0


async def _run(args: argparse.Namespace, dataset: Dataset) -> int:
    model, requests, exact = await prepare(args, dataset)
    endpoint = EndpointConfig(
        base_url=args.base_url.rstrip("/"),
        model=model,
        endpoint_type=args.endpoint_type,
        api_key=args.api_key,
        ignore_eos=args.ignore_eos,
        temperature=args.temperature,
        extra_body=args.extra_body,
    )
    load = LoadConfig(args.request_rate, args.burstiness, args.max_concurrency, args.seed,
                      args.request_timeout, show_progress=not args.disable_tqdm)
    print(f"kvserve bench: {len(requests)} {dataset.name} prompts -> {endpoint.url} "
          f"(model {model}, rate {args.request_rate}, burstiness {args.burstiness}, "
          f"max concurrency {args.max_concurrency})", file=sys.stderr)
    if args.num_warmups > 0 and requests:
        # As vllm bench serve: copies of the first prompt, capped like the run, sent all at once.
        print(f"kvserve bench: warming up with {args.num_warmups} requests", file=sys.stderr)
        warm = LoadConfig(float("inf"), 1.0, args.max_concurrency, args.seed, args.request_timeout,
                          show_progress=False)
        await run_load([requests[0]] * args.num_warmups, endpoint, warm)
    result = await run_load(requests, endpoint, load)
    return report(args, dataset, model, exact, result)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        validate(args)
        dataset = make_dataset(args)
        parse_goodput(args.goodput)
        parse_percentiles(args.metric_percentiles)
        if args.compare:
            from kvserve.loadtests.compare.compare_cli import validate_compare

            validate_compare(args)
    except ValueError as exc:
        print(f"kvserve bench: {exc}", file=sys.stderr)
        return 2
    if args.compare:
        from kvserve.loadtests.compare.compare_cli import run_compare_command

        return run_compare_command(args, dataset)
    try:
        return asyncio.run(_run(args, dataset))
    except ValueError as exc:
        print(f"kvserve bench: {exc}", file=sys.stderr)
        return 2
    except (aiohttp.ClientError, RuntimeError, OSError) as exc:
        print(f"kvserve bench: cannot benchmark {args.base_url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
