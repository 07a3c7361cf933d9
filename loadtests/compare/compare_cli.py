"""`kvserve bench --compare`: the serving benchmark's workload, run against
transformers and kvserve side by side in one command.

    kvserve bench --compare --dataset-name lognormal --num-prompts 64 \\
        --random-input-len 160 --random-range-ratio 0.6 \\
        --lognormal-output-median 64 --lognormal-output-max 256 \\
        --static-batch-size 16 --naive-max-requests 16 --json compare.json

Prompts are token ids of exact lengths (compare_prompts.py), decoding is
greedy with EOS ignored, so every baseline does exactly the same work.
"""
from __future__ import annotations

import argparse
import math
import sys

from kvserve.loadtests.compare import CompareUnavailable, resolve_baselines
from kvserve.loadtests.compare.compare_model import ensure_bench_model, model_facts, prompt_vocab_size
from kvserve.loadtests.compare.compare_prompts import describe_prompts, token_prompts
from kvserve.loadtests.compare.compare_report import build_compare_document, format_compare
from kvserve.loadtests.compare.compare_run import CompareOptions, resolve_device, run_baselines
from kvserve.loadtests.bench.datasets import Dataset
from kvserve.loadtests.bench.bench_metrics import parse_percentiles
from kvserve.loadtests.bench.report import write_json
from kvserve.loadtests.bench.runner import LoadConfig


def validate_compare(args: argparse.Namespace) -> None:
    resolve_baselines(args.compare_baselines)
    if args.endpoint_type != "completions":
        raise ValueError("--compare sends token-id prompts, which only --endpoint-type completions takes")
    if args.temperature != 0.0:
        raise ValueError("--compare is greedy (every baseline must produce the same tokens); drop --temperature")
    if args.static_batch_size < 1:
        raise ValueError(f"--static-batch-size must be >= 1, got {args.static_batch_size}")
    if args.naive_max_requests < 0:
        raise ValueError(f"--naive-max-requests must be >= 0 (0: all), got {args.naive_max_requests}")
    if args.compare_repeat < 1:
        raise ValueError(f"--compare-repeat must be >= 1, got {args.compare_repeat}")
    if args.stream_interval is not None and args.stream_interval < 1:
        raise ValueError(f"--stream-interval must be >= 1, got {args.stream_interval}")
    if args.cpu_reserved_cores is not None and args.cpu_reserved_cores < 0:
        raise ValueError(f"--cpu-reserved-cores must be >= 0, got {args.cpu_reserved_cores}")


def _percentiles(text: str) -> tuple[float, ...]:
    # The table always shows p50 and p99 of TTFT, whatever else was asked for.
    return tuple(sorted(set(parse_percentiles(text)) | {50.0, 99.0}))


def options_from_args(args: argparse.Namespace, model_dir: str) -> CompareOptions:
    return CompareOptions(
        model_dir=model_dir,
        baselines=resolve_baselines(args.compare_baselines),
        dtype=args.dtype,
        device=args.device,
        static_batch_size=args.static_batch_size,
        naive_max_requests=args.naive_max_requests,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        stream_interval=args.stream_interval,
        cpu_reserved_cores=args.cpu_reserved_cores,
        repeat=args.compare_repeat,
        base_url=args.base_url,
        api_key=args.api_key,
        load=LoadConfig(args.request_rate, args.burstiness, args.max_concurrency, args.seed,
                        args.request_timeout, show_progress=not args.disable_tqdm),
        startup_timeout_s=args.server_startup_timeout,
    )


def header_lines(model: dict[str, object], workload: dict[str, object], dataset: Dataset, opts: CompareOptions,
                 device: str) -> list[str]:
    rate = opts.load.request_rate
    arrival = "all arriving at once" if math.isinf(rate) else f"(d) at {rate:g} req/s, (a)-(c) all at once"
    engine = []
    if opts.cpu_reserved_cores:
        engine = [f"kvserve engine of (c) and of the server (d) starts: {opts.cpu_reserved_cores} CPU core(s) "
                  f"reserved for the serving path"]
    return [
        f"model: {model['path']} ({int(model['num_parameters']) / 1e6:.1f}M params, "
        f"{int(model['weight_bytes']) / 2**20:.0f} MiB {opts.dtype}, {device})",
        f"workload: {dataset.name}, {workload['num_requests']} requests {arrival}; prompts "
        f"{workload['input_len_min']}-{workload['input_len_max']} tokens ({int(workload['total_input_tokens']):,}); "
        f"outputs median {float(workload['output_len_median']):g}, max {workload['output_len_max']} "
        f"({int(workload['total_output_tokens']):,}); greedy, EOS ignored",
        *engine,
    ]


def run_compare_command(args: argparse.Namespace, dataset: Dataset) -> int:
    """Everything after argument checks; returns the exit status."""
    try:
        model_dir = ensure_bench_model(args.model)
        opts = options_from_args(args, model_dir)
        requests = token_prompts(dataset, prompt_vocab_size(model_dir))
        percentiles = _percentiles(args.metric_percentiles)
        runs = run_baselines(requests, opts)
    except ValueError as exc:
        print(f"kvserve bench: {exc}", file=sys.stderr)
        return 2
    except (CompareUnavailable, ImportError, OSError, RuntimeError) as exc:
        print(f"kvserve bench --compare: {exc}", file=sys.stderr)
        return 1
    device = resolve_device(opts.device)
    model = {**model_facts(model_dir, opts.dtype), "dtype": opts.dtype, "device": device,
             "prompt_token_ids_below": prompt_vocab_size(model_dir)}
    workload = describe_prompts(requests)
    print(format_compare(runs, header_lines(model, workload, dataset, opts, device), percentiles,
                         opts.load.request_rate))
    if args.json_path:
        config = {k: v for k, v in vars(args).items() if k != "api_key"}
        config.update(api_key_set=bool(args.api_key), model=model_dir)
        doc = build_compare_document(runs, percentiles, config, dataset.describe(), workload, model,
                                     detailed=args.save_detailed)
        print(f"wrote {write_json(doc, args.json_path)}")
    served = next((r for r in runs if r.key == "d"), None)
    if args.plot and served is not None:
        from kvserve.loadtests.bench.plots import write_plot

        title = f"kvserve serve | {dataset.name} | {len(served.records)} req"
        print(f"wrote {write_plot(served.records, served.duration, args.plot, title)}")
    failed = sum(1 for r in runs for rec in r.records if not rec.success)
    if failed:
        print(f"kvserve bench --compare: {failed} request(s) failed; see the table", file=sys.stderr)
        return 1
    return 0
