"""What structured outputs cost: throughput beside constrained streams, and grammar compile time.

    python -m kvserve.loadtests.studies.structured_bench --rounds 6 --json structured.json

Serving (one `kvserve serve` on the default model, or --base-url), three arms of 16 concurrent
chat streams, each stream max_tokens long (ignore_eos; a constrained stream's schema asks for a
string of 8 characters per token, more than a story's tokens average, so every stream runs to
max_tokens; min_tokens in the results shows it did):
    free16     16 unconstrained
    mixed15+1  15 unconstrained + 1 constrained (goal: the 15 lose at most 10 % beside it)
    json16     16 constrained
Each round runs the three arms back to back in a rotated order, so the machine's drift over
minutes falls on every arm alike; the figures are medians over rounds of the per-round ratios.
Throughput is output tokens per second of wall time from the first request to the last token.

Compile (in this process, on the model's tokenizer, no server): every schema of the test set
(loadtests/studies/structured_schemas.py) compiled cold (a fresh compiler each repeat; the one-time
vocabulary setup is done before timing) and cached (the engine's bounded cache), p50 and p99.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from contextlib import ExitStack

import aiohttp

from kvserve.loadtests.bench.report import write_json
from kvserve.loadtests.compare.baseline_kvserve import ServeProcess
from kvserve.loadtests.studies.structured_schemas import SCHEMAS

ARMS = {"free16": 0, "mixed15+1": 1, "json16": 16}  # arm -> constrained streams of 16
STREAMS = 16
CHARS_PER_TOKEN = 8  # above what a story's tokens average, so the string outlasts max_tokens


def long_schema(max_tokens: int) -> dict:
    """A schema whose one string outlasts the stream. Sized to the run, not fixed: xgrammar's
    compile time grows with the square of minLength (4,000 took 8-10 s on a 2-core machine without
    AVX-512, past the engine's 10 s compile bound, where 1,024 takes 0.5 s)."""
    story = {"type": "string", "minLength": max(64, CHARS_PER_TOKEN * max_tokens)}
    return {"type": "object", "properties": {"story": story}, "required": ["story"],
            "additionalProperties": False}

PROMPT = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper, as JSON."}]


async def _stream(session: aiohttp.ClientSession, url: str, model: str, max_tokens: int,
                  constrained: bool) -> tuple[int, float]:
    body = {"model": model, "messages": PROMPT, "max_tokens": max_tokens, "temperature": 0.7, "seed": 1,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "story",
                                                                    "schema": long_schema(max_tokens)}}
    tokens = 0
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    tokens = usage["completion_tokens"]
    return tokens, time.perf_counter()


async def _arm(url: str, model: str, constrained: int, max_tokens: int) -> dict[str, float]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        start = time.perf_counter()
        results = await asyncio.gather(*[_stream(session, url, model, max_tokens, i < constrained)
                                         for i in range(STREAMS)])
    free = [r for i, r in enumerate(results) if i >= constrained]
    wall = max(t for _, t in results) - start
    out = {"tokens_per_s": sum(n for n, _ in results) / wall, "min_tokens": min(n for n, _ in results)}
    if free:
        out["free_tokens_per_s"] = sum(n for n, _ in free) / (max(t for _, t in free) - start)
    return out


async def _model(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/v1/models") as resp:
        return (await resp.json())["data"][0]["id"]


def serving(url: str, rounds: int, max_tokens: int) -> dict:
    model = asyncio.run(_model(url))
    asyncio.run(_arm(url, model, 1, 8))  # warm-up: the first compile loads xgrammar in the engine
    names = list(ARMS)
    per_round = []
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        got = {name: asyncio.run(_arm(url, model, ARMS[name], max_tokens)) for name in order}
        per_round.append(got)
        print(f"round {r + 1}: " + ", ".join(f"{n} {got[n]['tokens_per_s']:.1f} tok/s" for n in names),
              file=sys.stderr)
    med = statistics.median
    return {
        "rounds": per_round,
        "mixed_free_vs_free16": med(x["mixed15+1"]["free_tokens_per_s"] / x["free16"]["tokens_per_s"]
                                    for x in per_round),
        "mixed_total_vs_free16": med(x["mixed15+1"]["tokens_per_s"] / x["free16"]["tokens_per_s"]
                                     for x in per_round),
        "json16_vs_free16": med(x["json16"]["tokens_per_s"] / x["free16"]["tokens_per_s"] for x in per_round),
    }


def compile_times(model: str | None, repeats: int) -> dict:
    from kvserve.backend.structured.compiler import GrammarCompiler
    from kvserve.backend.structured.spec import parse_spec
    from kvserve.backend.engine.engine_tokenizer import load_engine_tokenizer
    from kvserve.frontend.cli.default_model import resolve_model

    tokenizer = load_engine_tokenizer(resolve_model(model))
    vocab = tokenizer.vocab_size
    specs = [parse_spec({"json": s}) for s in SCHEMAS.values()]
    cold, cached = [], []
    for _ in range(repeats):
        compiler = GrammarCompiler(tokenizer, vocab, tokenizer.eos_token_ids)
        compiler.compile(parse_spec({"regex": "warm-up"}))  # xgrammar import and vocabulary table, once
        for spec in specs:
            t0 = time.perf_counter()
            compiler.compile(spec)
            cold.append(time.perf_counter() - t0)
        for spec in specs:
            t0 = time.perf_counter()
            compiler.submit(spec).result()  # what a request pays on a cache hit
            cached.append(time.perf_counter() - t0)
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
    return {"schemas": len(specs), "samples": len(cold),
            "cold_ms": {"p50": q(cold, 0.5) * 1e3, "p99": q(cold, 0.99) * 1e3},
            "cached_ms": {"p50": q(cached, 0.5) * 1e3, "p99": q(cached, 0.99) * 1e3}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.studies.structured_bench", description=__doc__.split("\n")[0])
    p.add_argument("--base-url", help="a running server (default: start kvserve serve on --model)")
    p.add_argument("--model", help="model for the server and the tokenizer (default: the default model)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--compile-repeats", type=int, default=5)
    p.add_argument("--skip-serving", action="store_true")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    doc: dict = {"compile": compile_times(args.model, args.compile_repeats)}
    print(json.dumps(doc["compile"]), file=sys.stderr)
    if not args.skip_serving:
        with ExitStack() as stack:
            url = args.base_url
            if url is None:
                from kvserve.frontend.cli.default_model import resolve_model
                url = stack.enter_context(ServeProcess(str(resolve_model(args.model)),
                                                       ["--max-num-seqs", str(STREAMS)])).base_url
            doc["serving"] = serving(url, args.rounds, args.max_tokens)
    summary = {k: v for k, v in doc.get("serving", {}).items() if k != "rounds"}
    print(json.dumps({"compile": doc["compile"], **summary}, indent=1))
    if args.json:
        write_json(doc, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
