"""Where the serving share of a batch-1 token goes: the engine's steps timed inside a served kvserve,
beside the same steps offline.

    python -m kvserve.loadtests.studies.serving.served_step --model GGUF_OR_DIR [--pairs 3] \\
        [--prompts 12] [--quantization int4] [--serve-flag=--flag ...] [--json FILE]

#30 defines the serving share as the served TPOT less the offline decode step. serving_path_cost.py
says how much CPU the path spends per token; this says where that lands in the engine's time. Each
pair runs, one after the other:
- offline, in a child process: `LLM` on the model, rounds of 128 greedy decode steps after a
  256-token random prompt (step_overhead.py's workload);
- served: `kvserve serve` with step_hook/ on its PYTHONPATH, so the host's engine logs every step,
  while `kvserve bench` sends --prompts random 256 -> 128 requests at concurrency 1, every token
  streamed, after one warm-up request.
Both split a step as step_overhead.py does: the native decode step, the logits projection, the rest
(Python and small torch operations). Printed per pair: the client's mean TPOT; each side's mean
decode step and its split; the served engine's mean step interval (one decode step's start to the
next one's); and the share, split into what grew in service (the rest, the native step, the logits),
the time between steps (delivering the outputs, the engine loop) and what the client saw beyond the
engine's step interval. Means throughout: a TPOT is a mean of its request's intervals.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HOOK_DIR = Path(__file__).resolve().parent / "step_hook"
sys.path.insert(0, str(HOOK_DIR))
from step_timers import install, read_log  # noqa: E402  (the hook folder, not a package)

SERVE_FLAGS = ["--dtype", "float32", "--kv-cache-memory", "4GiB", "--seed", "0"]
PROMPT_LEN, DECODE_STEPS = 256, 128


def _split(rows: list) -> dict[str, float]:
    """Mean ms of the decode steps (those that ran the native decode step) and of their parts."""
    decode = [r for r in rows if r[2] > 0]
    if not decode:
        raise RuntimeError("no decode step ran the native decode step (is the native library built?)")
    step = statistics.fmean(r[1] - r[0] for r in decode) * 1e3
    native = statistics.fmean(r[2] for r in decode) * 1e3
    logits = statistics.fmean(r[3] for r in decode) * 1e3
    return {"steps": len(decode), "step": step, "native": native, "logits": logits, "rest": step - native - logits}


def offline(model: str, rounds: int, quantization: str) -> list:
    """The child's work: every step's row, rounds of DECODE_STEPS after a PROMPT_LEN-token prompt."""
    import random

    from kvserve.backend import LLM, SamplingParams
    from kvserve.backend.engine.engine import LLMEngine
    from kvserve.kernels import cpu_native

    llm = LLM(model=model, dtype="float32", max_num_seqs=1, quantization=quantization)
    log = install(LLMEngine, cpu_native, None)
    rng = random.Random(0)
    top = min(20000, llm.engine.vocab_size)  # ids past the special tokens (the tiny test model has 512)
    rows: list = []
    for r in range(rounds + 1):  # the first round warms up
        prompt = [rng.randrange(min(100, top // 5), top) for _ in range(PROMPT_LEN)]
        llm.engine.add_request(f"r{r}", prompt, SamplingParams(max_tokens=DECODE_STEPS + 1, temperature=0,
                                                                ignore_eos=True))
        start = len(log.rows)
        while llm.engine.has_unfinished():
            llm.engine.step()
        if r:
            rows.extend(log.rows[start:])
    return rows


def _offline_child(model: str, rounds: int, quantization: str) -> dict[str, float]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([sys.executable, "-m", "kvserve.loadtests.studies.serving.served_step", "--offline-child",
                        "--model", model, "--rounds", str(rounds), "--quantization", quantization,
                        "--json", out.name], check=True, stdout=subprocess.DEVNULL)
        with open(out.name) as f:
            return _split(json.load(f))


def served(model: str, prompts: int, serve_flags: list[str]) -> dict[str, float]:
    from kvserve.loadtests.compare.baseline_kvserve import ServeProcess

    with tempfile.TemporaryDirectory(prefix="kvserve-served-step-") as tmp:
        log_path, bench_json = os.path.join(tmp, "steps.log"), os.path.join(tmp, "bench.json")
        env = {"PYTHONPATH": os.pathsep.join(p for p in (str(HOOK_DIR), os.environ.get("PYTHONPATH")) if p),
               "KVSERVE_STUDY_STEP_LOG": log_path}
        with ServeProcess(model, SERVE_FLAGS + serve_flags, extra_env=env) as server:
            subprocess.run([sys.executable, "-m", "kvserve.loadtests.bench.bench_cli", "--base-url",
                            server.base_url, "--dataset-name", "random", "--random-input-len",
                            str(PROMPT_LEN), "--random-output-len", str(DECODE_STEPS), "--num-prompts",
                            str(prompts), "--max-concurrency", "1", "--num-warmups", "1", "--ignore-eos",
                            "--seed", "0", "--disable-tqdm", "--json", bench_json],
                           check=True, stdout=subprocess.DEVNULL)
        with open(bench_json) as f:
            bench = json.load(f)
        rows = read_log(log_path)  # the last steps (< FLUSH_STEPS) may be lost with the server: the means hold
    # From one decode step's start to the next one's (two decode steps in a row: one request's).
    intervals = [b[0] - a[0] for a, b in zip(rows, rows[1:]) if a[2] > 0 and b[2] > 0]
    return {**_split(rows), "interval": statistics.fmean(intervals) * 1e3,
            "tpot": float(bench["mean_tpot_ms"]), "tpot_median": float(bench["median_tpot_ms"])}


def share(off: dict[str, float], srv: dict[str, float]) -> dict[str, float]:
    """The served TPOT less the offline step, in parts that add up to it."""
    return {"share": srv["tpot"] - off["step"], "rest": srv["rest"] - off["rest"],
            "native": srv["native"] - off["native"], "logits": srv["logits"] - off["logits"],
            "gap": srv["interval"] - srv["step"], "client": srv["tpot"] - srv["interval"]}


def format_pair(i: int, off: dict[str, float], srv: dict[str, float], parts: dict[str, float]) -> str:
    return (f"pair {i}: served TPOT {srv['tpot']:.2f} (median {srv['tpot_median']:.2f}); served step "
            f"{srv['step']:.2f} = native {srv['native']:.2f} + logits {srv['logits']:.2f} + rest {srv['rest']:.2f}, "
            f"interval {srv['interval']:.2f}; offline step {off['step']:.2f} = native {off['native']:.2f} + logits "
            f"{off['logits']:.2f} + rest {off['rest']:.2f}\n"
            f"        share {parts['share']:.2f} ms = rest {parts['rest']:+.2f} + native {parts['native']:+.2f} "
            f"+ logits {parts['logits']:+.2f} + between steps {parts['gap']:+.2f} + client {parts['client']:+.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.studies.serving.served_step",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="model folder or .gguf")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--prompts", type=int, default=12, help="measured requests per served run")
    p.add_argument("--rounds", type=int, default=3, help="offline rounds of 128 steps")
    p.add_argument("--quantization", default="none", choices=("none", "int8", "int4"))
    p.add_argument("--serve-flag", action="append", default=[], help="a further `kvserve serve` argument")
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE")
    p.add_argument("--offline-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.offline_child:
        with open(args.json_path, "w") as f:
            json.dump(offline(args.model, args.rounds, args.quantization), f)
        return 0
    serve_flags = args.serve_flag + ([] if args.quantization == "none" else ["--quantization", args.quantization])
    pairs = []
    for i in range(1, args.pairs + 1):
        off = _offline_child(args.model, args.rounds, args.quantization)
        srv = served(args.model, args.prompts, serve_flags)
        parts = share(off, srv)
        print(format_pair(i, off, srv, parts), flush=True)
        pairs.append({"offline": off, "served": srv, "share": parts})
    for key in ("share", "rest", "native", "logits", "gap", "client"):
        values = [pair["share"][key] for pair in pairs]
        print(f"{key:>8}: median {statistics.median(values):+.2f} ms over {len(values)} pairs "
              f"({', '.join(f'{v:+.2f}' for v in values)})")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"model": args.model, "quantization": args.quantization, "serve_flags": serve_flags,
                       "pairs": pairs}, f, indent=1)
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
