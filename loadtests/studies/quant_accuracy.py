"""Accuracy cost of `--quantization` and `--kv-cache-dtype`: greedy agreement with the unquantized engine, and
perplexity of a fixed text.

    python -m kvserve.loadtests.studies.quant_accuracy --model DIR [--modes int8 int4]
    python -m kvserve.loadtests.studies.quant_accuracy --model DIR --kv-dtypes fp8_e4m3 fp8_e5m2 bfloat16

For each mode (and for `none`, the reference, in `--dtype`):
- greedy agreement: 16 fixed prompts x 64 tokens (EOS ignored) against the
  reference's tokens: how many of the 16 continuations are identical, the mean
  length of the common prefix, and the share of positions that agree;
- perplexity of a fixed text (default: the corpus shipped with kvserve, or
  `--text FILE`), teacher-forced, in windows of `--window` tokens;
- the same text's first `--decode-tokens` tokens teacher-forced through decode steps of one row
  each: the path of a batch-1 decode step (the few-row kernels, where `int4` multiplies with
  int8-quantized activations), which the prefill windows above never take.
With `--batch N` the greedy prompts run N at a time (1: every decode step has one row).
With `--kv-dtypes` (and no `--modes`, unless given too) the weights stay unquantized and only the
KV cache's dtype changes, against the reference's `auto` (the model's dtype): the perplexity windows
are prefills whose attention reads the keys and values back from the cache, so they pay its rounding
as decode steps do. Then also printed: the largest |K| and |V| the reference stored (fp8's scale of
1.0 needs them inside e4m3's range, 448) and the tokens each cache dtype fits in `--memory`.
Offline and deterministic: one process, no server.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.worker.model_runner import AttentionMetadata

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three laws of thermodynamics are",
    "Translate to German: The weather is nice today.",
    "Explain in two sentences why the sky is blue.",
    "List five fruits that are red:",
    "Once upon a time, in a village by the mountains,",
    "The main difference between TCP and UDP is",
    "import numpy as np\n\n# Compute the mean of each column of a matrix\n",
    "Q: If a train travels 60 km in 45 minutes, what is its average speed?\nA:",
    "Dear customer, we are sorry to inform you that",
    "The recipe for a simple tomato sauce:",
    "In 1969, the first humans",
    "SELECT name, COUNT(*) FROM orders",
    "A haiku about autumn leaves:",
]
_DEFAULT_TEXT = Path(__file__).resolve().parents[2] / "backend" / "models" / "corpus.txt"
_KV_DTYPES = ("fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")


def greedy_tokens(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    return [o.outputs[0].token_ids for o in outs]


def agreement(got: list[list[int]], ref: list[list[int]]) -> dict[str, float]:
    prefixes, same = [], 0
    for g, r in zip(got, ref):
        n = next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), min(len(g), len(r)))
        prefixes.append(n)
        same += sum(a == b for a, b in zip(g, r))
    total = sum(len(r) for r in ref)
    return {"identical": sum(g == r for g, r in zip(got, ref)), "prompts": len(ref),
            "mean_common_prefix": sum(prefixes) / len(prefixes), "position_agreement": same / total}


@torch.inference_mode()
def perplexity(llm: LLM, ids: list[int], window: int) -> float:
    """exp(mean NLL) of ids[1:], each window of tokens one prefill through the engine's own model and ops."""
    runner = llm.engine.runner
    bs, dev = runner.block_size, runner.device
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start:start + window + 1]
        n = len(chunk) - 1
        if n < 1:
            break
        blocks = -(-n // bs)
        meta = AttentionMetadata(
            slot_mapping=torch.arange(n, device=dev) + bs,  # blocks 1.. (block 0 is the null block)
            block_tables=torch.arange(1, blocks + 1, dtype=torch.int32, device=dev)[None],
            seq_lens=torch.tensor([n], dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=dev),
            max_seq_len=n, max_query_len=n, decode_only=n == 1)
        x = torch.tensor(chunk[:-1], device=dev)
        logits = runner.model(runner.ops, x, torch.arange(n, device=dev), runner.kv_caches, meta,
                              torch.arange(n, device=dev))
        targets = torch.tensor(chunk[1:], device=dev)
        nll += float(torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum"))
        count += n
    return math.exp(nll / count)


@torch.inference_mode()
def decode_perplexity(llm: LLM, ids: list[int]) -> float:
    """exp(mean NLL) of ids[1:], each token one decode step of one row over the cache the steps
    before it wrote; NaN for a model of more than one KV group (Gemma 3's sliding layers: one block
    table here does not fit each group's pool)."""
    runner = llm.engine.runner
    if len(runner.kv_groups) > 1:
        return math.nan
    bs, dev = runner.block_size, runner.device
    n = len(ids) - 1
    tables = torch.arange(1, -(-n // bs) + 1, dtype=torch.int32, device=dev)[None]  # block 0 is the null block
    nll = 0.0
    for t in range(n):
        meta = AttentionMetadata(
            slot_mapping=torch.tensor([t + bs], device=dev), block_tables=tables,
            seq_lens=torch.tensor([t + 1], dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor([0, 1], dtype=torch.int32, device=dev),
            max_seq_len=t + 1, max_query_len=1, decode_only=True)
        logits = runner.model(runner.ops, torch.tensor([ids[t]], device=dev), torch.tensor([t], device=dev),
                              runner.kv_caches, meta, torch.zeros(1, dtype=torch.int64, device=dev))
        nll += float(torch.nn.functional.cross_entropy(logits.float(), torch.tensor([ids[t + 1]], device=dev)))
    return math.exp(nll / n)


def _record_extremes(llm: LLM) -> dict[str, float]:
    """Wrap the engine's KV store to keep the largest |K| and |V| it is handed."""
    ops, seen = llm.engine.runner.ops, {"k": 0.0, "v": 0.0}
    store = ops.store_kv

    def recording(key, value, key_cache, value_cache, slot_mapping):
        seen["k"] = max(seen["k"], float(key.abs().max()))
        seen["v"] = max(seen["v"], float(value.abs().max()))
        store(key, value, key_cache, value_cache, slot_mapping)

    ops.store_kv = recording
    return seen


def _variants(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """(result name, engine arguments): the reference first, then each weight mode and KV dtype."""
    modes = args.modes if args.modes is not None else ([] if args.kv_dtypes else ["int8", "int4"])
    return [("none", {}), *((m, {"quantization": m}) for m in modes),
            *((f"kv:{d}", {"kv_cache_dtype": d}) for d in args.kv_dtypes)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.studies.quant_accuracy",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model folder")
    p.add_argument("--modes", nargs="+", default=None, choices=("int8", "int4"),
                   help="weight modes (default: int8 int4, or none with --kv-dtypes)")
    p.add_argument("--kv-dtypes", nargs="+", default=[], choices=_KV_DTYPES,
                   help="KV cache dtypes to compare with the model's own")
    p.add_argument("--memory", type=int, default=4 * 2 ** 30, help="KV bytes whose token count --kv-dtypes prints")
    p.add_argument("--dtype", default="float32", help="dtype of the reference and of the quantized engines")
    p.add_argument("--prompts", type=int, default=16, help=f"how many of the {len(PROMPTS)} prompts")
    p.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt")
    p.add_argument("--text", default=str(_DEFAULT_TEXT), help="text file for the perplexity")
    p.add_argument("--max-text-tokens", type=int, default=2048)
    p.add_argument("--window", type=int, default=512, help="tokens per teacher-forced window")
    p.add_argument("--decode-tokens", type=int, default=256,
                   help="tokens of the text teacher-forced through one-row decode steps (at most --window are)")
    p.add_argument("--batch", type=int, default=None, help="greedy prompts at a time (default: all)")
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (not 1 <= args.prompts <= len(PROMPTS) or args.tokens < 1 or args.window < 1
            or args.decode_tokens < 2 or (args.batch is not None and args.batch < 1)):
        print("quant_accuracy: --prompts must be in [1, 16], --tokens, --window and --batch >= 1, "
              "--decode-tokens >= 2", file=sys.stderr)
        return 2
    decode_tokens = min(args.decode_tokens, args.window)
    results: dict[str, dict] = {}
    ref_tokens = None
    for mode, engine_args in _variants(args):
        llm = LLM(model=args.model, dtype=args.dtype, max_num_seqs=args.batch or args.prompts,
                  max_model_len=max(args.window + 1, 1024), **engine_args)
        runner = llm.engine.runner
        extremes = _record_extremes(llm) if mode == "none" and args.kv_dtypes else None
        tok = llm.get_tokenizer()
        prompts = [tok.encode(p) for p in PROMPTS[:args.prompts]]
        text_ids = tok.encode(Path(args.text).read_text(encoding="utf-8"))[:args.max_text_tokens]
        tokens = greedy_tokens(llm, prompts, args.tokens)
        row = {"perplexity": perplexity(llm, text_ids, args.window), "text_tokens": len(text_ids),
               "decode_perplexity": decode_perplexity(llm, text_ids[:decode_tokens]),
               "kv_dtype": str(runner.kv_dtype).removeprefix("torch."),
               "kv_tokens_in_memory": args.memory // runner.block_bytes * runner.block_size}
        if extremes is not None:
            row.update(max_abs_k=extremes["k"], max_abs_v=extremes["v"])
        if ref_tokens is None:
            ref_tokens = tokens
        else:
            row.update(agreement(tokens, ref_tokens))
        results[mode] = row
        del llm
    print(f"quantization accuracy: {args.model} ({args.dtype} reference), {args.prompts} prompts x {args.tokens} "
          f"greedy tokens, perplexity of {Path(args.text).name} ({results['none']['text_tokens']} tokens, "
          f"windows of {args.window})")
    ref = results["none"]
    if args.kv_dtypes:
        print(f"  reference KV cache {ref['kv_dtype']}: largest |K| stored {ref['max_abs_k']:.1f}, "
              f"|V| {ref['max_abs_v']:.1f} (fp8 e4m3's range: 448); KV tokens in {args.memory / 2 ** 30:g} GiB")
    kv = args.kv_dtypes
    print(f"  decode ppl: the first {decode_tokens} tokens through one-row decode steps")
    print(f"  {'mode':11} {'perplexity':>10} {'vs ref':>7} {'decode ppl':>10} {'vs ref':>7} {'identical':>10} "
          f"{'common prefix':>14} {'positions':>10}"
          + (f" {'KV tokens':>10}" if kv else ""))
    for mode, r in results.items():
        tokens = f" {r['kv_tokens_in_memory']:10,}" if kv else ""
        if mode == "none":
            print(f"  {mode:11} {r['perplexity']:10.3f} {'':>7} {r['decode_perplexity']:10.3f} {'':>7} "
                  f"{'(reference)':>10} {'':>14} {'':>10}{tokens}")
        else:
            change = 100 * (r["perplexity"] / ref["perplexity"] - 1)
            decode_change = 100 * (r["decode_perplexity"] / ref["decode_perplexity"] - 1)
            print(f"  {mode:11} {r['perplexity']:10.3f} {change:+6.2f}% {r['decode_perplexity']:10.3f} "
                  f"{decode_change:+6.2f}% {r['identical']:>5}/{r['prompts']:<4} "
                  f"{r['mean_common_prefix']:11.1f}/{args.tokens:<2} {100 * r['position_agreement']:9.1f}%{tokens}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"model": args.model, "config": vars(args), "results": results},
                                                   indent=2))
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
