"""What placing the ranks elsewhere costs per step on one machine: the same TP=2 engine on the tiny
Llama model with its worker as a local process (mp), as a second "node" (a separate process tree
joined over the TCP rendezvous, with heartbeats), and as a Ray actor (a local Ray instance).

    python loadtests/studies/parallel/nodes_overhead.py --rounds 5 [--no-ray]

The three engines live side by side and run the same greedy batch in turns (A, B, C, A, B, C, ...);
each is reported as the median seconds per round and its ratio to mp. On 127.0.0.1 all three use
the same gloo TCP pairs, so a ratio away from 1 is the executor's own cost (the heartbeat read, the
actor check), or noise from the machine's load.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from kvserve.backend import LLM, SamplingParams  # noqa: E402
from tests.conftest import tiny_model  # noqa: E402

PROMPTS = ["hello world", "a b c d e f g h", "the quick brown fox jumps", "one two three"]
ARGS = dict(max_model_len=256, num_kv_blocks=64, tensor_parallel_size=2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    model = tiny_model("llama")
    cores = len(os.sched_getaffinity(0))
    port = _free_port()
    node = subprocess.Popen([sys.executable, "-m", "kvserve.backend.worker.parallel.launch", "--nnodes", "2",
                             "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                             "--world-size", "2", "--model", model, "--cpu-reserved-cores", str(cores - 1)],
                            start_new_session=True)
    # One thread per rank everywhere: each "node" would otherwise take every core of this one machine.
    engines = {"mp": LLM(model=model, num_threads=2, **ARGS),
               "two nodes": LLM(model=model, nnodes=2, master_port=port, num_threads=1, **ARGS)}
    if not args.no_ray:
        engines["ray"] = LLM(model=model, distributed_executor_backend="ray", num_threads=2, **ARGS)
    params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    times: dict[str, list[float]] = {name: [] for name in engines}
    try:
        for r in range(args.rounds + 1):
            for name, llm in engines.items():
                start = time.perf_counter()
                llm.generate(PROMPTS, params)
                if r:  # round 0 warms up
                    times[name].append(time.perf_counter() - start)
    finally:
        for llm in engines.values():
            llm.engine.runner.close()
        node.wait(30)
    base = sorted(times["mp"])[len(times["mp"]) // 2]
    print(f"{len(PROMPTS)} prompts x {args.tokens} tokens, TP=2, {args.rounds} rounds interleaved")
    for name, values in times.items():
        median = sorted(values)[len(values) // 2]
        print(f"{name:10s} median {median:.3f} s/round  ratio to mp {median / base:.2f}  "
              f"(min {min(values):.3f}, max {max(values):.3f})")


if __name__ == "__main__":
    main()
