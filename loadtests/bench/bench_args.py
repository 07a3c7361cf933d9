"""Command-line flags of `kvserve bench`, named as in `vllm bench serve` where
that tool has the same knob, so commands carry over."""
from __future__ import annotations

import argparse
import json
import os

from kvserve.loadtests.compare import BASELINES
from kvserve.loadtests.bench.datasets import Dataset, LognormalDataset, RandomDataset, SharedPrefixDataset

DEFAULT_NUM_PROMPTS = 1000
DEFAULT_BASE_URL = "http://127.0.0.1:8000"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvserve bench",
        description="Benchmark an OpenAI-compatible server (streaming), in the manner of vllm bench serve.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    target = p.add_argument_group("target")
    target.add_argument("--base-url", default=None,
                        help=f"server root, without /v1 (default {DEFAULT_BASE_URL}; "
                             "with --compare: start kvserve serve on a free port)")
    target.add_argument("--endpoint-type", choices=("completions", "chat"), default="completions")
    target.add_argument("--model", default=None,
                        help="default: the first model of GET /v1/models; with --compare: the model folder "
                             "(default: the benchmark model in ~/.cache/kvserve/bench-512, made if missing)")
    # Read at run time, not as the default: --help prints defaults, and must not print a key.
    target.add_argument("--api-key", default=None, help="bearer token; default: $OPENAI_API_KEY")
    target.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")

    data = p.add_argument_group("dataset")
    data.add_argument("--dataset-name", choices=("random", "lognormal", "shared-prefix"), default="random")
    data.add_argument("--num-prompts", type=int, default=None,
                      help=f"default {DEFAULT_NUM_PROMPTS}; shared-prefix uses prefixes x questions")
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--no-tokenize", action="store_true",
                      help="do not use the server's /tokenize; estimate one token per word")
    data.add_argument("--tokenizer", default=None, metavar="PATH",
                      help="count prompt tokens with this local tokenizer (HF folder or tokenizer.json) instead "
                           "of the server's /tokenize: the same texts for any server (completions only)")
    data.add_argument("--random-input-len", type=int, default=1024)
    data.add_argument("--random-output-len", type=int, default=128)
    data.add_argument("--random-range-ratio", type=float, default=0.0,
                      help="lengths uniform in [len*(1-r), len*(1+r)]")
    data.add_argument("--lognormal-output-median", type=int, default=128)
    data.add_argument("--lognormal-output-max", type=int, default=2048)
    data.add_argument("--lognormal-sigma", type=float, default=1.0, help="tail weight (std of log length)")
    data.add_argument("--shared-prefix-num-prefixes", type=int, default=4, help="distinct system prompts")
    data.add_argument("--shared-prefix-questions-per-prefix", type=int, default=8)
    data.add_argument("--shared-prefix-prefix-len", type=int, default=512, help="tokens")
    data.add_argument("--shared-prefix-question-len", type=int, default=64, help="tokens")
    data.add_argument("--shared-prefix-output-len", type=int, default=128, help="tokens")

    load = p.add_argument_group("load")
    load.add_argument("--request-rate", type=float, default=float("inf"), help="req/s; inf sends all at once")
    load.add_argument("--burstiness", type=float, default=1.0,
                      help="gamma shape of inter-arrivals: 1 Poisson, <1 burstier, >1 steadier")
    load.add_argument("--max-concurrency", type=int, default=None)
    load.add_argument("--num-warmups", type=int, default=0,
                      help="send the first prompt this many times (under --max-concurrency) before the run, "
                           "unrecorded, as vllm bench serve does")
    load.add_argument("--ignore-eos", action="store_true", help="send ignore_eos: true (exact output lengths)")
    load.add_argument("--temperature", type=float, default=0.0)
    load.add_argument("--extra-body", type=json.loads, default={}, help="JSON merged into every request body")

    out = p.add_argument_group("results")
    out.add_argument("--goodput", nargs="+", default=[], metavar="NAME:MS",
                     help="SLOs for goodput, e.g. ttft:500 tpot:50 e2el:10000")
    out.add_argument("--metric-percentiles", default="50,90,99")
    out.add_argument("--json", dest="json_path", default=None, metavar="FILE")
    out.add_argument("--save-detailed", action="store_true", help="per-request records in the JSON")
    out.add_argument("--plot", default=None, metavar="PNG", help="latency CDFs + throughput over time")
    out.add_argument("--disable-tqdm", action="store_true")
    add_compare_flags(p)
    return p


def add_compare_flags(p: argparse.ArgumentParser) -> None:
    cmp = p.add_argument_group("compare (transformers and kvserve side by side on the same token-id prompts)")
    names = ", ".join(f"{k}={name}" for k, (name, _) in BASELINES.items())
    cmp.add_argument("--compare", action="store_true",
                     help="run the baselines below on this workload instead of benchmarking --base-url alone")
    cmp.add_argument("--compare-baselines", default=",".join(BASELINES), metavar="a,b,c,d",
                     help=f"which baselines ({names})")
    cmp.add_argument("--static-batch-size", type=int, default=16, help="B of the static-batching baseline (b)")
    cmp.add_argument("--naive-max-requests", type=int, default=16,
                     help="(a) measures this many requests one at a time and extrapolates the rest; 0: all")
    cmp.add_argument("--dtype", default="float32", choices=("auto", "float32", "float16", "bfloat16"),
                     help="weights and activations, every baseline")
    cmp.add_argument("--device", default="auto", help="transformers and in-process kvserve: auto, cpu, cuda, ...")
    cmp.add_argument("--max-num-seqs", type=int, default=None, help="kvserve engine flag for (c) and (d)")
    cmp.add_argument("--max-num-batched-tokens", type=int, default=None, help="kvserve engine flag for (c) and (d)")
    cmp.add_argument("--stream-interval", type=int, default=None,
                     help="kvserve serve flag for the server (d) starts: new tokens per streamed response")
    cmp.add_argument("--cpu-reserved-cores", type=int, default=None,
                     help="kvserve engine flag for (c) and (d): CPU cores the engine leaves to the serving path")
    cmp.add_argument("--compare-repeat", type=int, default=1, metavar="N",
                     help="run (c) and (d) N times each, alternating, on one engine and one server; the table "
                          "shows the pair with the median (d)/(c) ratio and lists every pair")
    cmp.add_argument("--server-startup-timeout", type=float, default=600.0,
                     help="seconds to wait for the kvserve serve that (d) starts")


def make_dataset(args: argparse.Namespace) -> Dataset:
    n = args.num_prompts if args.num_prompts is not None else DEFAULT_NUM_PROMPTS
    if args.dataset_name == "random":
        return RandomDataset(n, args.random_input_len, args.random_output_len, args.random_range_ratio, args.seed)
    if args.dataset_name == "lognormal":
        return LognormalDataset(n, args.random_input_len, args.random_range_ratio, args.lognormal_output_median,
                                args.lognormal_output_max, args.lognormal_sigma, args.seed)
    ds = SharedPrefixDataset(args.shared_prefix_num_prefixes, args.shared_prefix_questions_per_prefix,
                             args.shared_prefix_prefix_len, args.shared_prefix_question_len,
                             args.shared_prefix_output_len, args.seed)
    if args.num_prompts is not None and args.num_prompts != ds.num_prompts:
        raise ValueError(
            f"shared-prefix sends prefixes x questions = {ds.num_prompts} prompts; "
            f"--num-prompts {args.num_prompts} disagrees (drop it or change the two counts)"
        )
    return ds


def validate(args: argparse.Namespace) -> None:
    """Fail before any network traffic on values that can only be mistakes."""
    if args.api_key is None:
        args.api_key = os.environ.get("OPENAI_API_KEY") or None
    if args.base_url is None and not args.compare:
        args.base_url = DEFAULT_BASE_URL
    positive = {
        "--num-prompts": args.num_prompts if args.num_prompts is not None else 1,
        "--random-input-len": args.random_input_len,
        "--random-output-len": args.random_output_len,
        "--shared-prefix-num-prefixes": args.shared_prefix_num_prefixes,
        "--shared-prefix-questions-per-prefix": args.shared_prefix_questions_per_prefix,
        "--shared-prefix-prefix-len": args.shared_prefix_prefix_len,
        "--shared-prefix-question-len": args.shared_prefix_question_len,
        "--shared-prefix-output-len": args.shared_prefix_output_len,
        "--request-timeout": args.request_timeout,
    }
    for flag, value in positive.items():
        if value <= 0:
            raise ValueError(f"{flag} must be > 0, got {value}")
    if args.request_rate <= 0:
        raise ValueError(f"--request-rate must be > 0 (or inf), got {args.request_rate}")
    if args.burstiness <= 0:
        raise ValueError(f"--burstiness must be > 0, got {args.burstiness}")
    if args.num_warmups < 0:
        raise ValueError(f"--num-warmups must be >= 0, got {args.num_warmups}")
    if args.tokenizer is not None and (args.no_tokenize or args.endpoint_type == "chat"):
        raise ValueError("--tokenizer counts completions prompts; it goes with neither --no-tokenize "
                         "nor --endpoint-type chat")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    if not isinstance(args.extra_body, dict):
        raise ValueError("--extra-body must be a JSON object")
