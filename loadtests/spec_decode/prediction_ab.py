"""What OpenAI's predicted outputs (chat `prediction`) buy at batch 1: spec_bench.py's
input-grounded prompts on SmolLM2, decoded plainly, with ngram speculation, and with ngram
speculation plus a prediction: the passage or code the prompt quotes (what a client editing a
file sends), or the reply itself (the best a prediction can do).

    python -m kvserve.loadtests.spec_decode.prediction_ab --rounds 2 [--json F]

Every side runs the same greedy requests alone on its own engine, prompts in turn, side order
reversed each round, each request its own cache_salt. Decode time runs from a request's first
output token to its last (prefill excluded, as a served TPOT is); every side's tokens must equal
plain decoding's (verification is exact). Prints ms per output token per side, the ratios to
plain decoding, and the accepted share of proposals. One-off measurement, not installed.
"""
from __future__ import annotations

import argparse
import json

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.models import DEFAULT_CHAT_MODEL, ensure_known_model
from kvserve.frontend.openai.chat_template import render_chat
from kvserve.loadtests.spec_decode.copy_bound import run_request
from kvserve.loadtests.spec_decode.spec_bench import _CODE, _PASSAGE, _TYPOS, GROUNDED, SIDES

QUOTED = [_PASSAGE, _TYPOS, _PASSAGE, _CODE]  # what each GROUNDED prompt quotes, in order
SIDES_RUN = ("none", "ngram", "ngram+quoted", "ngram+reply")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--json")
    args = ap.parse_args()
    path = str(ensure_known_model(DEFAULT_CHAT_MODEL))
    plain = LLM(path, max_model_len=4096, num_kv_blocks=1024)
    spec = LLM(path, max_model_len=4096, num_kv_blocks=1024, speculative_config=SIDES["ngram"])
    llms = {"none": plain, "ngram": spec, "ngram+quoted": spec, "ngram+reply": spec}
    tok = plain.get_tokenizer()
    prompts = [tok.encode(render_chat(tok.chat_template, [{"role": "user", "content": p}], bos_token=tok.bos_token,
                                      eos_token=tok.eos_token)) for p in GROUNDED]
    reference = [run_request(plain, f"ref{i}", p, SamplingParams(max_tokens=args.output_len, temperature=0,
                                                                  cache_salt=f"ref{i}"))[0]
                 for i, p in enumerate(prompts)]
    replies = [tok.decode(r) for r in reference]

    def params(side: str, i: int, rid: str) -> SamplingParams:
        prediction = {"ngram+quoted": QUOTED[i], "ngram+reply": replies[i]}.get(side)
        return SamplingParams(max_tokens=args.output_len, temperature=0, cache_salt=rid, prediction=prediction)

    for side in SIDES_RUN:  # warm-up: kernels built, the policy fitted
        for i, p in enumerate(prompts[:2]):
            run_request(llms[side], f"warm-{side}-{i}", p, params(side, i, f"warm-{side}-{i}"))
    sums = {side: [0.0, 0, 0, 0] for side in SIDES_RUN}  # seconds, decode tokens, drafted, accepted
    mismatches = []
    for rnd in range(args.rounds):
        for i, p in enumerate(prompts):
            for side in (SIDES_RUN if rnd % 2 == 0 else SIDES_RUN[::-1]):
                rid = f"{side}-{rnd}-{i}"
                counters = llms[side].engine.speculator.counters if llms[side] is spec else None
                before = (counters.num_draft_tokens, counters.num_accepted_tokens) if counters else (0, 0)
                tokens, seconds, _ = run_request(llms[side], rid, p, params(side, i, rid))
                if tokens != reference[i]:
                    mismatches.append(rid)
                total = sums[side]
                total[0] += seconds
                total[1] += len(tokens) - 1
                if counters:
                    total[2] += counters.num_draft_tokens - before[0]
                    total[3] += counters.num_accepted_tokens - before[1]
    base = sums["none"][0] / max(sums["none"][1], 1)
    rows = {}
    for side, (seconds, tokens, drafted, accepted) in sums.items():
        ms = 1000 * seconds / max(tokens, 1)
        rows[side] = {"ms_per_token": round(ms, 3), "ratio_to_plain": round(ms / (1000 * base), 3),
                      "drafted": drafted, "accepted": accepted}
        print(f"{side:14s} {ms:7.2f} ms/token  x{ms / (1000 * base):5.3f} of plain   accepted {accepted}/{drafted}")
    print("tokens equal to plain decoding:", "yes" if not mismatches else f"NO: {mismatches}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "rounds": args.rounds, "output_len": args.output_len,
                       "mismatches": mismatches}, f, indent=1)


if __name__ == "__main__":
    main()
