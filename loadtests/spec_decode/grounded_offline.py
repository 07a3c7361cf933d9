"""Speculation at batch 1 on spec_bench.py's input-grounded prompts, offline: engines with and without
speculation in one process, each prompt run on every side in turn (the order reversed each round).

    python -m kvserve.loadtests.spec_decode.grounded_offline --sides none,ngram,suffix --rounds 2

Without the serving path and the other sides' servers on the same cores, this isolates what the
load policy and the verification steps do to a request's time per output token (prefill
included, the same on every side). Besides ms per token per round it prints, per side, the
drafts and accepted proposals, how often each of the policy's decisions was taken on a step
with a decoding request (`Grant.reason`, and the proposals it granted), and the mean time of its
pure-decode steps by query tokens (1: a plain step; more: one verifying proposals), as the
policy measures them. One-off measurement, not installed.
"""
from __future__ import annotations

import argparse
import collections
import json
import time

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.models import DEFAULT_CHAT_MODEL, ensure_known_model
from kvserve.frontend.openai.chat_template import render_chat
from kvserve.loadtests.spec_decode.spec_bench import GROUNDED, SIDES


def _count_decisions(llm: LLM, decisions: collections.Counter) -> None:
    """Count the policy's decision on every step that has a decoding request."""
    spec = llm.engine.speculator
    propose = spec.propose

    def counted(running, **kwargs):
        propose(running, **kwargs)
        if any(req.num_tokens - req.num_computed_tokens == 1 for req in running):
            granted = sum(spec.last_grant.num_tokens.values())
            decisions[f"{spec.last_grant.reason} (granted {granted})"] += 1

    spec.propose = counted


def _time_steps(llm: LLM, steps: dict[int, list[float]]) -> None:
    """Collect the pure-decode steps' forward times by query tokens, as the policy is told them."""
    spec = llm.engine.speculator
    observe = spec.observe_step

    def timed(num_tokens: int, seconds: float, num_spec_tokens: int) -> None:
        observe(num_tokens, seconds, num_spec_tokens)
        steps.setdefault(num_tokens, []).append(seconds)

    spec.observe_step = timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sides", default="none,ngram,suffix")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--json")
    args = ap.parse_args()
    sides = args.sides.split(",")
    path = str(ensure_known_model(DEFAULT_CHAT_MODEL))
    llms = {side: LLM(path, max_model_len=4096, num_kv_blocks=1024,
                      **({} if SIDES[side] is None else {"speculative_config": SIDES[side]})) for side in sides}
    tok = llms[sides[0]].get_tokenizer()
    prompts = [render_chat(tok.chat_template, [{"role": "user", "content": p}], bos_token=tok.bos_token,
                           eos_token=tok.eos_token) for p in GROUNDED]
    for llm in llms.values():  # warm-up: the kernels built, the policy's cost lines fitted
        llm.generate(prompts[:2], SamplingParams(max_tokens=64, temperature=0))
    decisions = {side: collections.Counter() for side in sides}
    steps: dict[str, dict[int, list[float]]] = {side: {} for side in sides}
    for side, llm in llms.items():
        if llm.engine.speculator is not None:
            _count_decisions(llm, decisions[side])
            _time_steps(llm, steps[side])
    counters0 = {side: _counters(llm) for side, llm in llms.items()}
    params = SamplingParams(max_tokens=args.output_len, temperature=0)
    timed = {side: [[0.0, 0] for _ in range(args.rounds)] for side in sides}
    for rnd in range(args.rounds):
        for prompt in prompts:
            for side in (sides if rnd % 2 == 0 else sides[::-1]):
                started = time.perf_counter()
                out = llms[side].generate([prompt], params)[0]
                timed[side][rnd][0] += time.perf_counter() - started
                timed[side][rnd][1] += len(out.outputs[0].token_ids)
    report = {}
    for side in sides:
        drafts, accepted = (a - b for a, b in zip(_counters(llms[side]), counters0[side]))
        ms = [round(1000 * seconds / tokens, 2) for seconds, tokens in timed[side]]
        step_ms = {n: [round(1000 * sum(t) / len(t), 2), len(t)] for n, t in sorted(steps[side].items())}
        report[side] = {"ms_per_token_by_round": ms, "draft_tokens": drafts, "accepted_tokens": accepted,
                        "decisions": dict(decisions[side].most_common()), "step_ms_by_query_tokens": step_ms}
        print(f"{side}: ms per output token by round {ms}; proposals {drafts}, accepted {accepted}")
        if step_ms:
            print("    mean step ms [steps] by query tokens: "
                  + ", ".join(f"{n}: {t} [{c}]" for n, (t, c) in step_ms.items()))
        for decision, count in decisions[side].most_common(8):
            print(f"    {count:5d}  {decision}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


def _counters(llm: LLM) -> tuple[int, int]:
    spec = llm.engine.speculator
    return (0, 0) if spec is None else (spec.counters.num_draft_tokens, spec.counters.num_accepted_tokens)


if __name__ == "__main__":
    main()
