"""Offline throughput: kvserve `LLM.generate` on N prompts at once versus the
same N prompts run one at a time through transformers `generate()`.

    python -m kvserve.loadtests.compare.offline_throughput --model DIR

Both see the same token-id prompts of exact length and produce exactly
`--output-len` greedy tokens each (EOS ignored), so output tokens/s is a fair
ratio. Every transformers request is measured (no extrapolation here). The
machinery is `kvserve bench --compare`'s baselines (a) and (c).
"""
from __future__ import annotations

import argparse
import sys

from kvserve.loadtests.compare.compare_model import ensure_bench_model, model_facts, prompt_vocab_size
from kvserve.loadtests.compare.compare_prompts import describe_prompts, token_prompts
from kvserve.loadtests.compare.compare_run import CompareOptions, ratios, resolve_device, run_baselines
from kvserve.loadtests.bench.datasets import RandomDataset
from kvserve.loadtests.bench.report import _jsonable, write_json


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.compare.offline_throughput", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=None, help="model folder (default: the benchmark model bench-512)")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens")
    p.add_argument("--output-len", type=int, default=64, help="output tokens per prompt")
    p.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in [len*(1-r), len*(1+r)]")
    p.add_argument("--dtype", default="float32", choices=("auto", "float32", "float16", "bfloat16"))
    p.add_argument("--device", default="auto")
    p.add_argument("--max-num-seqs", type=int, default=None, help="kvserve engine flag")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for flag in ("num_prompts", "input_len", "output_len"):
        if getattr(args, flag) < 1:
            print(f"offline_throughput: --{flag.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    try:
        model_dir = ensure_bench_model(args.model)
        dataset = RandomDataset(args.num_prompts, args.input_len, args.output_len, args.range_ratio, args.seed)
        requests = token_prompts(dataset, prompt_vocab_size(model_dir))
    except ValueError as exc:
        print(f"offline_throughput: {exc}", file=sys.stderr)
        return 2
    opts = CompareOptions(model_dir=model_dir, baselines=("a", "c"), dtype=args.dtype, device=args.device,
                          naive_max_requests=0, max_num_seqs=args.max_num_seqs,
                          log=None if args.quiet else sys.stderr)
    runs = {r.key: r for r in run_baselines(requests, opts)}
    hf, kv = runs["a"].metrics((50.0,)), runs["c"].metrics((50.0,))
    ratio = ratios({"a": hf.output_throughput, "c": kv.output_throughput}).get("c_over_a", float("nan"))
    work = describe_prompts(requests)
    print(f"offline throughput: {work['num_requests']} prompts, {work['total_input_tokens']:,} prompt + "
          f"{work['total_output_tokens']:,} output tokens, greedy, EOS ignored; {model_dir} "
          f"({args.dtype}, {resolve_device(args.device)})")
    print(f"  transformers generate(), one at a time: {hf.output_throughput:10,.1f} out tok/s  ({hf.duration:.2f} s)")
    print(f"  kvserve LLM.generate, all at once:      {kv.output_throughput:10,.1f} out tok/s  ({kv.duration:.2f} s)")
    print(f"  ratio kvserve / transformers: {ratio:.2f}x")
    if args.json_path:
        doc = {"model": {**model_facts(model_dir, args.dtype), "dtype": args.dtype},
               "workload": work, "config": vars(args),
               "hf_serial": hf.to_dict(), "kvserve_offline": kv.to_dict(),
               "hf_serial_output_throughput": hf.output_throughput,
               "kvserve_offline_output_throughput": kv.output_throughput, "ratio": ratio}
        print(f"wrote {write_json(_jsonable(doc), args.json_path)}")
    return 0 if hf.failed == 0 and kv.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
