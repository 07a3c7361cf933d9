"""How far speculation can go at batch 1 on spec_bench.py's input-grounded prompts with this model:
the suffix proposer beside two oracles that know each request's greedy output in advance.

    python -m kvserve.loadtests.spec_decode.copy_bound --rounds 2 [--json F]

- `copy-oracle` proposes, at each step, the longest run of the coming output that occurs verbatim
  anywhere in the request's prompt or output so far (at most `num_speculative_tokens`). No proposer
  that copies from the request's own text (ngram, suffix over the request) can do better in a
  step: it would need a longer verbatim run than exists. Its time per token is the floor for those
  methods on fresh requests (what the model copies decides it, not the proposer).
- `future-oracle` proposes the coming output itself, whatever it is: every proposal is accepted,
  and the time per token is what verification rows cost on this machine (a perfect, free draft).

Every request is fresh: each has a cache_salt of its own, so the suffix proposer never proposes
another request's output. Every side runs the same greedy requests on its own engine (the oracles
through the suffix method's config with `load_policy: "off"`, so every proposal is verified),
prompts in turn, the side order reversed each round. A request's decode time is measured from its
first output token to its last (prefill excluded, as a served TPOT is), and every side's tokens are
checked against the plain engine's: verification is exact, so they must be identical. Prints ms per
output token per side and prompt, the ratios to plain decoding, and the output tokens per step.
One-off measurement, not installed.
"""
from __future__ import annotations

import argparse
import json
import time

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.models import DEFAULT_CHAT_MODEL, ensure_known_model
from kvserve.frontend.openai.chat_template import render_chat
from kvserve.loadtests.spec_decode.spec_bench import GROUNDED, SIDES

ORACLES = ("copy-oracle", "future-oracle")


def longest_copied_run(context: list[int], coming: list[int], limit: int) -> list[int]:
    """The longest prefix of `coming` (at most `limit` tokens) that occurs verbatim in `context`."""
    best = 0
    first = coming[0] if coming else None
    for start, token in enumerate(context):
        if token != first:
            continue
        n = 1
        while n < limit and n < len(coming) and start + n < len(context) and context[start + n] == coming[n]:
            n += 1
        best = max(best, n)
        if best == limit:
            break
    return coming[:best]


class OracleProposer:
    """Proposes from each request's known greedy output (`expected`: request id -> output tokens)."""

    def __init__(self, expected: dict[str, list[int]], copy_only: bool) -> None:
        self.expected = expected
        self.copy_only = copy_only

    def sync(self, running) -> None:
        pass

    def propose(self, req, k: int) -> list[int]:
        done = len(req.output_token_ids)
        coming = self.expected[req.request_id][done:done + k]
        if not self.copy_only:
            return coming
        return longest_copied_run(req.all_token_ids, coming, k)


def run_request(llm: LLM, request_id: str, prompt_ids: list[int], params: SamplingParams):
    """One request alone: (output tokens, seconds from its first output token to its last, steps then)."""
    engine = llm.engine
    engine.add_request(request_id, prompt_ids, params)
    tokens: list[int] = []
    first_at = None
    steps = 0
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.outputs[0].token_ids
        if first_at is None and tokens:
            first_at = time.perf_counter()
        elif first_at is not None:
            steps += 1
    return tokens, time.perf_counter() - first_at, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sides", default="none,suffix,copy-oracle,future-oracle")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--side", action="append", default=[], metavar="NAME=JSON",
                    help="one more side: a speculative_config of its own (repeatable)")
    ap.add_argument("--json")
    args = ap.parse_args()
    configs = dict(SIDES)
    for spec in args.side:
        name, _, config = spec.partition("=")
        configs[name] = json.loads(config)
    sides = args.sides.split(",") + [spec.partition("=")[0] for spec in args.side]
    unknown = [s for s in sides if s not in configs and s not in ORACLES]
    if unknown or "none" not in sides:
        raise SystemExit(f"--sides: names from {', '.join([*configs, *ORACLES])}, with none among them")
    path = str(ensure_known_model(DEFAULT_CHAT_MODEL))
    expected: dict[str, list[int]] = {}
    llms = {}
    for side in sides:
        config = ({**SIDES["suffix"], "load_policy": "off"} if side in ORACLES else configs[side])
        llms[side] = LLM(path, max_model_len=4096, num_kv_blocks=1024,
                         **({} if config is None else {"speculative_config": config}))
        if side in ORACLES:
            llms[side].engine.speculator.proposer = OracleProposer(expected, copy_only=side == "copy-oracle")
    tok = llms["none"].get_tokenizer()
    prompts = [tok.encode(render_chat(tok.chat_template, [{"role": "user", "content": p}], bos_token=tok.bos_token,
                                      eos_token=tok.eos_token)) for p in GROUNDED]
    # Every request its own cache_salt: the suffix proposer never sees another request's output
    # (fresh requests; a repeated one would be proposed the output it had before).
    def params(rid: str) -> SamplingParams:
        return SamplingParams(max_tokens=args.output_len, temperature=0, cache_salt=rid)

    reference = [run_request(llms["none"], f"ref{i}", p, params(f"ref{i}"))[0] for i, p in enumerate(prompts)]
    for llm in llms.values():  # warm-up: kernels built, the suffix side's policy fitted
        for i, p in enumerate(prompts[:2]):
            expected[f"warm{i}"] = reference[i]
            run_request(llm, f"warm{i}", p, params(f"warm{i}"))
    # per side and prompt: [seconds, decode tokens, steps] summed over rounds
    sums = {side: [[0.0, 0, 0] for _ in prompts] for side in sides}
    mismatches = []
    for rnd in range(args.rounds):
        for i, p in enumerate(prompts):
            for side in (sides if rnd % 2 == 0 else sides[::-1]):
                rid = f"{side}-{rnd}-{i}"
                expected[rid] = reference[i]
                tokens, seconds, steps = run_request(llms[side], rid, p, params(rid))
                if tokens != reference[i]:
                    mismatches.append(rid)
                sums[side][i][0] += seconds
                sums[side][i][1] += len(tokens) - 1
                sums[side][i][2] += steps
    report = {"output_tokens": [len(r) for r in reference], "mismatches": mismatches, "sides": {}}
    def ms_per_token(runs) -> float:  # runs: [seconds, decode tokens, steps] rows, summed
        return 1000 * sum(s for s, _, _ in runs) / max(sum(n for _, n, _ in runs), 1)

    plain_ms = ms_per_token(sums["none"])
    plain_by_prompt = [ms_per_token([row]) for row in sums["none"]]
    for side in sides:
        per_prompt = [ms_per_token([row]) for row in sums[side]]
        total_ms = ms_per_token(sums[side])
        per_step = [n / max(steps, 1) for _, n, steps in sums[side]]
        report["sides"][side] = {
            "ms_per_token": round(total_ms, 3), "ratio_to_none": round(total_ms / plain_ms, 3),
            "ms_per_token_by_prompt": [round(x, 3) for x in per_prompt],
            "ratio_by_prompt": [round(x / p, 3) for x, p in zip(per_prompt, plain_by_prompt)],
            "tokens_per_step_by_prompt": [round(x, 2) for x in per_step]}
        r = report["sides"][side]
        print(f"{side:14s} {total_ms:6.2f} ms/token ({r['ratio_to_none']:.3f}x none); by prompt "
              f"{r['ratio_by_prompt']}x, tokens a step {r['tokens_per_step_by_prompt']}")
    print(f"output tokens by prompt {report['output_tokens']}; outputs differing from plain greedy: "
          f"{mismatches or 'none'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
