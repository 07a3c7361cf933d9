"""Pipeline parallelism against one process, side by side in one script: offline greedy throughput
of the same batch through four engines (five with --per-op), interleaved round by round (A, A1, B, C, A, ...):

    A   PP=1, every core, the default path (the native decode step on)
    A1  PP=1, one thread (what one rank of PP=2 gets)
    A'  PP=1, every core, the per-operation path (KVSERVE_CPU_DECODE_STEP=0: what a stage runs); --per-op
    B   PP=2, two micro-batches per step (the default: one per stage)
    C   PP=2, one micro-batch per step (no overlap between the stages)
    D   TP=3, three ranks (SmolLM2's 9 heads take 3, not 2); --tp

    python loadtests/studies/parallel/pp_throughput.py [--model PATH] [--prompts 16] [--tokens 32] [--rounds 3]

Each engine gets every core (PP=2: one per rank). Reports per engine the median tokens/s, its ratio
to A, and CPU seconds per generated token summed over its processes (/proc: rank 0's process is
this one, so only the running engine's threads count; the idle engines block in a wait).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from kvserve.backend import LLM, SamplingParams

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def _engine(model: str, pp: int, env: dict[str, str], common: dict, tp: int = 1) -> LLM:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return LLM(model=model, pipeline_parallel_size=pp, tensor_parallel_size=tp, **common)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-op", action="store_true", help="add A'")
    parser.add_argument("--tp", action="store_true", help="add D (TP=3)")
    args = parser.parse_args()
    if args.model is None:
        from kvserve.backend.models import DEFAULT_CHAT_MODEL, ensure_known_model
        args.model = str(ensure_known_model(DEFAULT_CHAT_MODEL))
    cores = os.cpu_count() or 1
    common = dict(max_model_len=512, num_kv_blocks=400, max_num_seqs=args.prompts, num_threads=cores)
    engines = {
        "A  PP=1": (_engine(args.model, 1, {}, common), cores),
        "A1 PP=1, 1 thread": (_engine(args.model, 1, {}, {**common, "num_threads": 1}), 1),
    }
    if args.per_op:
        engines["A' PP=1 per-op"] = (_engine(args.model, 1, {"KVSERVE_CPU_DECODE_STEP": "0"}, common), cores)
    engines |= {
        "B  PP=2, 2 micro-batches": (_engine(args.model, 2, {"KVSERVE_PP_MICRO_BATCHES": "2"}, common), cores // 2),
        "C  PP=2, 1 micro-batch": (_engine(args.model, 2, {"KVSERVE_PP_MICRO_BATCHES": "1"}, common), cores // 2),
    }
    if args.tp:
        engines["D  TP=3"] = (_engine(args.model, 1, {}, common, tp=3), max(1, cores // 3))
    prompts = [f"Item {i}: write one sentence about the number {i * 7}." for i in range(args.prompts)]
    params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    rates: dict[str, list[float]] = {k: [] for k in engines}
    cpu: dict[str, list[float]] = {k: [] for k in engines}
    for name, (llm, threads) in engines.items():  # warm-up
        torch.set_num_threads(max(1, threads))
        llm.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0))
    for _ in range(args.rounds):
        for name, (llm, threads) in engines.items():
            torch.set_num_threads(max(1, threads))  # process-wide: the engine that runs now sets it
            executor = llm.engine.runner.executor
            pids = [os.getpid()] + ([p.pid for p in executor.procs] if executor is not None else [])
            cpu0 = sum(_cpu_seconds(p) for p in pids)
            start = time.perf_counter()
            outs = llm.generate(prompts, params)
            wall = time.perf_counter() - start
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            rates[name].append(tokens / wall)
            cpu[name].append((sum(_cpu_seconds(p) for p in pids) - cpu0) / tokens)
    base = statistics.median(rates["A  PP=1"])
    print(f"{args.prompts} prompts x {args.tokens} tokens, {args.rounds} rounds, {cores} cores, load average "
          f"{os.getloadavg()[0]:.1f}")
    print("| engine | tokens/s (median) | ratio to A | CPU ms per token |")
    print("|---|---|---|---|")
    for name in engines:
        rate = statistics.median(rates[name])
        print(f"| {name} | {rate:.1f} | {rate / base:.2f} | {1000 * statistics.median(cpu[name]):.1f} |")
    for llm, _ in engines.values():
        llm.engine.runner.close()


if __name__ == "__main__":
    main()
