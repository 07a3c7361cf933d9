"""Speculation's load policy at a full batch, offline: engines with and without speculation in one
process, the same 16-at-a-time random-text workload, rounds interleaved A, B, C / C, B, A.

    python -m kvserve.loadtests.spec_decode.offline_ab --rounds 3 --json offline_ab.json

The workload is spec_bench.py's random one (prompts of 256 random words, 64 greedy tokens each,
ignore_eos) on SmolLM2-135M-Instruct, run through `LLM.generate` with max_num_seqs 16. Besides wall
time it records the process's CPU seconds per output token (all threads; less sensitive than wall
time to what else runs on a shared machine, though not immune) and, per side, how many steps the
policy skipped the proposer, the drafts and the accepted tokens.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.models import DEFAULT_CHAT_MODEL, ensure_known_model
from kvserve.loadtests.bench.datasets import RandomDataset
from kvserve.loadtests.bench.prompt_builder import WordPromptBuilder

SIDES = {
    "none": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "suffix": {"method": "suffix", "num_speculative_tokens": 16},
}


def one_run(llm: LLM, prompts: list[str], params: SamplingParams) -> dict[str, float]:
    spec = llm.engine.speculator
    before = None if spec is None else (spec.counters.num_draft_tokens, spec.counters.num_accepted_tokens,
                                        spec.num_skipped_steps, llm.engine.runner.num_steps)
    steps0 = llm.engine.runner.num_steps
    wall, cpu = time.perf_counter(), time.process_time()
    outs = llm.generate(prompts, params)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    row = {"wall_s": wall, "cpu_s": cpu, "output_tokens": tokens, "output_tok_s": tokens / wall,
           "cpu_ms_per_token": 1000 * cpu / tokens, "steps": llm.engine.runner.num_steps - steps0}
    if spec is not None:
        row.update(draft_tokens=spec.counters.num_draft_tokens - before[0],
                   accepted_tokens=spec.counters.num_accepted_tokens - before[1],
                   skipped_steps=spec.num_skipped_steps - before[2])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--warmup-tokens", type=int, default=32,
                    help="a warm-up run of the workload with this many output tokens per side, so the "
                         "policy has fitted its costs (as a server has after its first minutes)")
    ap.add_argument("--json")
    args = ap.parse_args()
    model = str(ensure_known_model(DEFAULT_CHAT_MODEL))
    reqs = asyncio.run(RandomDataset(num_prompts=args.prompts, input_len=args.input_len,
                                     output_len=args.output_len, seed=1).sample(WordPromptBuilder()))
    prompts = [r.prompt for r in reqs]
    params = SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)
    sides = args.sides.split(",")
    engines = {side: LLM(model=model, max_model_len=1024, num_kv_blocks=1024, max_num_seqs=args.max_num_seqs,
                         speculative_config=SIDES[side]) for side in sides}
    for side, llm in engines.items():  # warm-up: the policy learns its costs
        llm.generate(prompts, SamplingParams(max_tokens=args.warmup_tokens, temperature=0, ignore_eos=True))
    rows: dict[str, list[dict]] = {side: [] for side in sides}
    for rnd in range(args.rounds):
        for side in (sides if rnd % 2 == 0 else list(reversed(sides))):
            rows[side].append(one_run(engines[side], prompts, params))
            print(rnd, side, json.dumps(rows[side][-1]), flush=True)
    summary = {}
    for side in sides:
        summary[side] = {"output_tok_s": statistics.mean(r["output_tok_s"] for r in rows[side]),
                         "cpu_ms_per_token": statistics.mean(r["cpu_ms_per_token"] for r in rows[side]),
                         "rounds": rows[side]}
        # Per round against the "none" run of the same round: the pairs saw the same load.
        if "none" in rows and side != "none":
            summary[side]["throughput_vs_none_per_round"] = [
                r["output_tok_s"] / n["output_tok_s"] for r, n in zip(rows[side], rows["none"])]
            summary[side]["cpu_per_token_vs_none_per_round"] = [
                r["cpu_ms_per_token"] / n["cpu_ms_per_token"] for r, n in zip(rows[side], rows["none"])]
            drafted = sum(r["draft_tokens"] for r in rows[side])
            summary[side]["acceptance"] = sum(r["accepted_tokens"] for r in rows[side]) / drafted if drafted else None
    for side in sides:
        if side != "none" and "none" in summary:
            print(side, "throughput vs none per round:",
                  [round(x, 3) for x in summary[side]["throughput_vs_none_per_round"]],
                  "cpu/token vs none:", [round(x, 3) for x in summary[side]["cpu_per_token_vs_none_per_round"]],
                  "acceptance:", summary[side]["acceptance"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
