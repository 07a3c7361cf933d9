"""How close batch-1 decode comes to the memory-bandwidth roofline.

    python -m kvserve.loadtests.studies.roofline --model DIR

A decode step at batch 1 must read every weight once (plus the request's KV
cache), and does almost no arithmetic per byte, so its floor is
bytes / bandwidth. We measure:
- copy bandwidth: a large tensor copy on the engine's device, median of
  several; bytes counted are read + written (the STREAM "copy" convention);
- bytes per step: all weights except the embedding table (a step reads one
  row of it; with tied embeddings the table is the LM head and is read whole),
  plus the KV cache read at the mean context length of the run;
- kvserve's decode step: `LLM.generate` of one prompt, time per output token
  after the first (mean gap between tokens), median over repeats.
The fraction (bytes / bandwidth) / step time is 1.0 at the roofline; far below
it, the step is paying for something other than memory traffic (Python,
kernel launches, small-matrix inefficiency).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from kvserve.loadtests.compare.compare_model import ensure_bench_model, model_facts, prompt_vocab_size
from kvserve.loadtests.compare.compare_prompts import CompareRequest
from kvserve.loadtests.bench.datasets import rng_for
from kvserve.loadtests.bench.report import _jsonable, write_json


def copy_bandwidth(device: str, nbytes: int, repeats: int) -> tuple[float, list[float]]:
    """Median bytes/s of `dst.copy_(src)` (read + write), and every sample."""
    import torch

    n = max(nbytes // 4, 1)
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if src.is_cuda else (lambda: None)
    dst.copy_(src)  # first touch: page faults are not bandwidth
    sync()
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        sync()
        rates.append(2 * n * 4 / (time.perf_counter() - t))
    return statistics.median(rates), rates


def decode_step_time(llm, prompt_len: int, output_len: int, repeats: int, vocab: int) -> tuple[float, list[float]]:
    """Median over repeats of the mean time per output token after the first."""
    from kvserve.loadtests.compare.baseline_kvserve import run_offline

    samples = []
    for rep in range(repeats):
        # A fresh prompt each time: a cached prefix would skip the prefill, not change decode, but keep it honest.
        ids = rng_for(rep, 200).integers(0, vocab, size=prompt_len).tolist()
        run = run_offline(llm, [CompareRequest(0, ids, output_len)])
        rec = run.records[0]
        if not rec.success or not rec.itl:
            raise RuntimeError("decode produced fewer than two tokens")
        samples.append(sum(rec.itl) / len(rec.itl))
    return statistics.median(samples), samples


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.studies.roofline", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=None, help="model folder (default: the benchmark model bench-512)")
    p.add_argument("--dtype", default="float32", choices=("auto", "float32", "float16", "bfloat16"))
    p.add_argument("--device", default="auto", help="engine device; the copy runs on the same one")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="decode runs (median)")
    p.add_argument("--copy-mib", type=int, default=512, help="size of the copied tensor; well beyond the caches")
    p.add_argument("--copy-repeats", type=int, default=7)
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.output_len < 2 or args.prompt_len < 1 or args.repeats < 1 or args.copy_repeats < 1 or args.copy_mib < 1:
        print("roofline: need --output-len >= 2 and positive lengths, sizes and repeats", file=sys.stderr)
        return 2
    try:
        model_dir = ensure_bench_model(args.model)
    except ValueError as exc:
        print(f"roofline: {exc}", file=sys.stderr)
        return 2
    from kvserve.loadtests.compare.baseline_kvserve import make_llm

    engine_args = {"dtype": args.dtype, **({} if args.device == "auto" else {"device": args.device})}
    llm = make_llm(model_dir, engine_args)
    runner = llm.engine.runner
    device = str(runner.device)
    dtype_name = str(runner.dtype).removeprefix("torch.")
    facts = model_facts(model_dir, dtype_name)
    elem = int(facts["weight_bytes"]) // max(int(facts["num_parameters"]), 1)
    embed_bytes = 0 if facts["tie_word_embeddings"] else int(facts["embedding_parameters"]) * elem
    weight_read = int(facts["weight_bytes"]) - embed_bytes
    mean_context = args.prompt_len + args.output_len / 2
    kv_read = int(runner.kv_bytes_per_token * mean_context)
    step_bytes = weight_read + kv_read

    step_s, step_samples = decode_step_time(llm, args.prompt_len, args.output_len, args.repeats,
                                            prompt_vocab_size(model_dir))
    del llm
    bandwidth, bw_samples = copy_bandwidth(device, args.copy_mib * 2**20, args.copy_repeats)
    ideal_s = step_bytes / bandwidth
    fraction = ideal_s / step_s

    print(f"roofline: {model_dir} ({dtype_name}, {device})")
    print(f"  copy bandwidth (read+write, median of {args.copy_repeats}): {bandwidth / 1e9:10.2f} GB/s")
    print(f"  weight bytes:                    {int(facts['weight_bytes']):>14,} "
          f"({int(facts['num_parameters']) / 1e6:.1f}M params)")
    print(f"  bytes read per decode step:      {step_bytes:>14,} (weights {weight_read:,} + KV {kv_read:,})")
    print(f"  ideal step (bytes / bandwidth):  {ideal_s * 1e3:10.3f} ms")
    print(f"  kvserve decode step, batch 1:    {step_s * 1e3:10.3f} ms  "
          f"(prompt {args.prompt_len}, {args.output_len} tokens, median of {args.repeats})")
    print(f"  fraction of roofline:            {fraction:10.3f}  "
          f"(achieved {step_bytes / step_s / 1e9:.2f} GB/s)")
    if args.json_path:
        doc = {"model": facts, "device": device, "dtype": dtype_name, "config": vars(args),
               "copy_bandwidth_bytes_per_s": bandwidth, "copy_bandwidth_samples": bw_samples,
               "weight_bytes": int(facts["weight_bytes"]), "weight_bytes_read_per_step": weight_read,
               "kv_bytes_read_per_step": kv_read, "bytes_per_step": step_bytes,
               "ideal_step_s": ideal_s, "decode_step_s": step_s, "decode_step_samples_s": step_samples,
               "achieved_bytes_per_s": step_bytes / step_s, "roofline_fraction": fraction}
        print(f"wrote {write_json(_jsonable(doc), args.json_path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
