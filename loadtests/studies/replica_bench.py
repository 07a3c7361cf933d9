"""Scaling out on one machine: throughput through one gateway in front of 1, 2
and 3 embedded hosts, and the prefix-cache hit rate with affinity on vs off.

    python -m kvserve.loadtests.studies.replica_bench --replicas 1,2,3 --json replica_bench.json

Each point starts fresh hosts (`python -m kvserve.backend.host`, the benchmark
model unless --model) and a `kvserve serve --triton-url ...` gateway, then runs
the `kvserve bench` client code against it (loadtests/bench/runner.py): a `random`
workload for throughput, the `shared-prefix` workload for the hit rate, read
from the hosts' own kvserve:prefix_cache_{hits,queries}_total.

Every replica is a whole engine competing for the same CPU cores here: on a
machine with few cores, throughput stays flat as replicas are added (the
forward pass was already using every core); on one GPU per replica it grows
about linearly. The affinity comparison does not depend on that: with it off,
requests of one prefix are spread over the replicas and each replica has to
prefill the prefix once more.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from kvserve.frontend.cli.host_process import HostAddress, HostProcess, free_port, host_command
from kvserve.loadtests.bench.bench_once import bench_once
from kvserve.loadtests.bench.report import write_json
from kvserve.loadtests.bench.server_api import metric_sums
from kvserve.loadtests.compare.compare_model import ensure_bench_model

REPO = Path(__file__).resolve().parents[2]
_CACHE_COUNTERS = ("kvserve:prefix_cache_hits_total", "kvserve:prefix_cache_queries_total")


@dataclass(slots=True)
class Cluster:
    url: str
    hosts: list[HostAddress]

    def host_counters(self, names: tuple[str, ...]) -> tuple[float, ...]:
        """Each counter summed over every host (one scrape per host)."""
        pages = [metric_sums(f"http://{host.metrics}/metrics", names) for host in self.hosts]
        return tuple(sum(page.get(name, 0.0) for page in pages) for name in names)


@contextmanager
def cluster(model_dir: str, replicas: int, gateway_flags: list[str], engine_env: dict[str, str],
            timeout_s: float) -> Iterator[Cluster]:
    repository = str(REPO / "model_repository")
    env = {**os.environ, **engine_env, "KVSERVE_MODEL": model_dir, "OTEL_TRACES_EXPORTER": "none",
           "PYTHONUNBUFFERED": "1"}
    hosts = [HostProcess(host_command(repository, free_port(), free_port()), env) for _ in range(replicas)]
    gateway: subprocess.Popen[str] | None = None
    try:
        # One after another, from this thread: the hosts die with the thread that
        # started them (PR_SET_PDEATHSIG), so no worker threads here.
        addresses = [h.start(timeout_s) for h in hosts]
        argv = [sys.executable, "-m", "kvserve.frontend.cli", "serve", "--model", model_dir, "--port", "0",
                "--served-model-name", "bench", "--log-format", "console", *gateway_flags]
        for a in addresses:
            argv += ["--triton-url", a.grpc, "--triton-metrics-url", f"http://{a.metrics}/metrics"]
        gateway = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                   env={**os.environ, "OTEL_TRACES_EXPORTER": "none"})
        line = gateway.stdout.readline() if gateway.stdout else ""
        if not line.startswith("kvserve gateway ready"):
            raise RuntimeError(f"the gateway did not start: {line!r}")
        yield Cluster(line.split()[3], addresses)
    finally:
        if gateway is not None:
            gateway.terminate()
            try:
                gateway.wait(timeout=30)
            except subprocess.TimeoutExpired:
                gateway.kill()
        for host in hosts:
            host.stop()


def run(opts: argparse.Namespace) -> dict[str, object]:
    model_dir = ensure_bench_model(opts.model)
    # Replicas share this machine's cores: idle OpenMP workers yield at once (docs/deployment.md, "Scaling out").
    engine_env = {"KVSERVE_MAX_NUM_SEQS": str(opts.max_num_seqs), "KVSERVE_DTYPE": opts.dtype,
                  "GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT", "100")}
    random_argv = ["--dataset-name", "random", "--num-prompts", str(opts.num_prompts),
                   "--random-input-len", str(opts.input_len), "--random-output-len", str(opts.output_len),
                   "--max-concurrency", str(opts.max_concurrency), "--seed", str(opts.seed)]
    shared_argv = ["--dataset-name", "shared-prefix", "--shared-prefix-num-prefixes", str(opts.prefixes),
                   "--shared-prefix-questions-per-prefix", str(opts.questions),
                   "--shared-prefix-prefix-len", str(opts.prefix_len), "--shared-prefix-question-len", "32",
                   "--shared-prefix-output-len", "16", "--max-concurrency", str(opts.max_concurrency),
                   "--seed", str(opts.seed)]
    doc: dict[str, object] = {"model": model_dir, "cpu_count": os.cpu_count(), "config": vars(opts),
                              "throughput": [], "affinity": []}
    for n in opts.replicas:
        with cluster(model_dir, n, [], engine_env, opts.startup_timeout) as c:
            t = time.perf_counter()
            m = asyncio.run(bench_once(c.url, random_argv))
            row = {"replicas": n, "output_throughput": m["output_throughput"],
                   "request_throughput": m["request_throughput"], "median_ttft_ms": m["median_ttft_ms"],
                   "p99_ttft_ms": m["p99_ttft_ms"], "completed": m["completed"], "failed": m["failed"],
                   "wall_s": time.perf_counter() - t}
            doc["throughput"].append(row)  # type: ignore[union-attr]
            print(f"replicas={n}: {row['output_throughput']:.1f} output tok/s, "
                  f"{row['request_throughput']:.2f} req/s, median TTFT {row['median_ttft_ms']:.0f} ms", flush=True)
    n = max(opts.replicas)
    for flag in ("--prefix-affinity", "--no-prefix-affinity"):
        with cluster(model_dir, n, [flag], engine_env, opts.startup_timeout) as c:
            before: list[float] = []

            def snapshot(c: Cluster = c) -> None:
                before[:] = c.host_counters(_CACHE_COUNTERS)

            m = asyncio.run(bench_once(c.url, shared_argv, snapshot))
            hits, queries = (now - then for now, then in zip(c.host_counters(_CACHE_COUNTERS), before))
            row = {"replicas": n, "affinity": flag == "--prefix-affinity", "hit_rate": hits / queries if queries else 0.0,
                   "cached_tokens": hits, "prompt_tokens_looked_up": queries,
                   "output_throughput": m["output_throughput"], "median_ttft_ms": m["median_ttft_ms"]}
            doc["affinity"].append(row)  # type: ignore[union-attr]
            print(f"replicas={n} {flag}: prefix-cache hit rate {row['hit_rate']:.1%} "
                  f"({hits:.0f}/{queries:.0f} prompt tokens), median TTFT {row['median_ttft_ms']:.0f} ms",
                  flush=True)
    return doc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.studies.replica_bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=None, help="model folder (default: the benchmark model, made if missing)")
    p.add_argument("--replicas", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3],
                   help="comma-separated replica counts")
    p.add_argument("--num-prompts", type=int, default=120)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--max-concurrency", type=int, default=24)
    p.add_argument("--prefixes", type=int, default=6, help="shared-prefix: distinct system prompts")
    p.add_argument("--questions", type=int, default=8, help="shared-prefix: questions per prompt")
    p.add_argument("--prefix-len", type=int, default=256, help="shared-prefix: system prompt tokens")
    p.add_argument("--max-num-seqs", type=int, default=32, help="engine flag of every host")
    p.add_argument("--dtype", default="float32", choices=("auto", "float32", "float16", "bfloat16"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    if not opts.replicas or min(opts.replicas) < 1:
        print("replica_bench: --replicas takes positive counts, e.g. 1,2,3", file=sys.stderr)
        return 2
    doc = run(opts)
    if opts.json_path:
        print(f"wrote {write_json(doc, opts.json_path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
