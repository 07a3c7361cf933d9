"""Two settings of kvserve's embed model, served side by side and measured in alternation.

    python -m kvserve.loadtests.studies.embed_ab --a KVSERVE_EMBED_NUM_WORKERS=1 \\
        --b KVSERVE_EMBED_NUM_WORKERS=2 --concurrency 1,16,64 --rounds 6

Both `kvserve serve --embedding-model` processes (as embed_bench starts them)
are up before the first round and stay up to the last; each round runs one
closed-loop point (embed_bench's texts and client) against A and then B,
alternating which goes first, so a drift in the machine's load falls on both.
Settings are environment variables of the server (KVSERVE_EMBED_<NAME> for the
embed model's parameters, KVSERVE_CPU_PACKED_LINEAR=0, GOMP_SPINCOUNT, ...).
Prints B/A embeddings/s per round and their median per level: on a shared
machine only the ratios mean anything. While one server is measured the other
is idle (its OpenMP workers asleep).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile

from kvserve.frontend.cli.host_process import free_port
from kvserve.loadtests.bench.report import write_json
from kvserve.loadtests.compare.embed_bench import _command, _wait_http, bench_texts, run_point


def parse_settings(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"embed_ab: a setting is NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def ab_ratios(rounds: list[dict[str, float]]) -> dict[str, float]:
    """B/A of embeddings/s per round, and their median, min and max."""
    ratios = [r["b"] / r["a"] for r in rounds]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


class Server:
    def __init__(self, model_dir: str, settings: dict[str, str], startup_s: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, OTEL_TRACES_EXPORTER="none", **settings)
        self.log = tempfile.NamedTemporaryFile("w+", prefix="embed_ab-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(_command("kvserve", model_dir, self.port, None), env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _wait_http(self.url, self.proc, startup_s)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="embed_ab", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", help="the embedding model folder (default: all-MiniLM-L6-v2, fetched once)")
    p.add_argument("--a", nargs="*", default=[], metavar="NAME=VALUE", help="server A's environment")
    p.add_argument("--b", nargs="*", default=[], metavar="NAME=VALUE", help="server B's environment")
    p.add_argument("--concurrency", default="16", help="comma-separated levels")
    p.add_argument("--requests", type=int, default=256, help="requests per point (at least 4x the concurrency)")
    p.add_argument("--rounds", type=int, default=6, help="A/B pairs per level")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--json", help="write every round and the ratios here")
    args = p.parse_args(argv)
    model_dir = args.model_dir
    if model_dir is None:
        from kvserve.frontend.cli.default_model import ensure_known_model
        model_dir = str(ensure_known_model("all-MiniLM-L6-v2"))
    settings = {"a": parse_settings(args.a), "b": parse_settings(args.b)}
    levels = [int(c) for c in args.concurrency.split(",")]
    texts = bench_texts(max(args.requests, 4 * max(levels)))
    servers: dict[str, Server] = {}
    doc: dict[str, object] = {"model": model_dir, "settings": settings, "levels": {}}
    try:
        for name in ("a", "b"):
            servers[name] = Server(model_dir, settings[name], args.startup_timeout)
            asyncio.run(run_point(servers[name].url, "embed", texts, 4, 32))  # warm-up
        for c in levels:
            n = max(args.requests, 4 * c)
            rounds = []
            for i in range(args.rounds):
                result = {}
                for name in ("a", "b") if i % 2 == 0 else ("b", "a"):
                    wall, _ = asyncio.run(run_point(servers[name].url, "embed", texts, c, n))
                    result[name] = n / wall
                rounds.append(result)
                print(f"c={c} round {i}: A {result['a']:.1f} emb/s, B {result['b']:.1f} emb/s, "
                      f"B/A {result['b'] / result['a']:.3f}", flush=True)
            summary = ab_ratios(rounds)
            print(f"c={c}: B/A median {summary['median']:.3f} (min {summary['min']:.3f}, max {summary['max']:.3f})",
                  flush=True)
            doc["levels"][str(c)] = {"rounds": rounds, "ratios": summary}  # type: ignore[index]
    finally:
        for server in servers.values():
            server.stop()
    if args.json:
        write_json(doc, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
