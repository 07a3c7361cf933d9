"""CPU milliseconds per streamed token that the serving path spends outside the engine's forward.

    python -m kvserve.loadtests.studies.serving.serving_path_cost [--model DIR_OR_GGUF] \\
        [--tokens 256] [--streams 4] [--endpoint chat|completions] [--serve-flag=--flag ...]

One `kvserve serve` (gateway process + embedded host child), one batch-1 stream at a time: each
request asks for `--tokens` tokens with `ignore_eos`, every token streamed (stream_interval 1).
After a warm-up stream, each thread's user + system CPU (/proc/<pid>/task/<tid>/stat) and its
voluntary / involuntary context switches are read before and after the measured streams and summed
by OS thread name. kvserve names its threads; torch's OpenMP workers inherit "kvserve-engine", so
that row is the model's compute plus the engine thread's own per-step work; "main" is a process's
first thread (its event loop); an unnamed "python" thread is grpc.aio's completion-queue poller.
Printed: CPU ms per streamed token for each process and thread group, and the serving path's
total (everything but the engine row). CPU time depends far less on the machine's load than
wall-clock time does (a loaded machine still inflates it somewhat: compare runs side by side).

The default model is the random tiny model (`kvserve make-tiny-model`'s), whose forward is cheap,
so a run takes seconds. Content chunks are counted: with SmolLM2 they match the tokens; the tiny
model's random ids often end inside a UTF-8 character, whose text waits for the next token.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import defaultdict

import aiohttp

from kvserve.loadtests.compare.baseline_kvserve import ServeProcess
from kvserve.loadtests.compare.compare_model import ensure_bench_model
from kvserve.loadtests.studies.thread_cpu import ThreadStats, by_thread_name, children, snapshot

ENGINE = "kvserve-engine"


async def _one_stream(session: aiohttp.ClientSession, base_url: str, model: str, endpoint: str,
                      tokens: int) -> tuple[int, int]:
    """One streamed request: (completion tokens from usage, SSE data chunks that carried content)."""
    body: dict[str, object] = {"model": model, "max_tokens": tokens, "ignore_eos": True, "temperature": 0,
                               "stream": True, "stream_options": {"include_usage": True}}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "Tell me a long story about a lighthouse."}]
        url = f"{base_url}/v1/chat/completions"
    else:
        body["prompt"] = "Once upon a time, in a lighthouse by the sea,"
        url = f"{base_url}/v1/completions"
    usage, chunks = 0, 0
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {await resp.text()}")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            doc = json.loads(line[6:])
            if doc.get("usage"):
                usage = int(doc["usage"]["completion_tokens"])
            if doc.get("choices"):
                chunks += 1
    return usage, chunks


async def _streams(base_url: str, endpoint: str, tokens: int, count: int) -> tuple[int, int]:
    total_tokens = total_chunks = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        async with session.get(f"{base_url}/v1/models") as resp:
            model = (await resp.json())["data"][0]["id"]
        for _ in range(count):
            got, chunks = await _one_stream(session, base_url, model, endpoint, tokens)
            total_tokens += got
            total_chunks += chunks
    return total_tokens, total_chunks


def _model_dir(model: str | None) -> str:
    if model:
        return ensure_bench_model(model)
    from kvserve.backend.models.tiny import default_model_dir, make_tiny_model
    return str(make_tiny_model(default_model_dir()))  # a forward of ~1 ms: the path is most of the work


def measure(opts: argparse.Namespace) -> dict[str, object]:
    model = opts.model if opts.model and opts.model.endswith(".gguf") else _model_dir(opts.model)
    with ServeProcess(model, opts.serve_flag, opts.startup_timeout) as server:
        processes = {"gateway": server.pid, **{f"host{i or ''}": p for i, p in enumerate(children(server.pid))}}
        asyncio.run(_streams(server.base_url, opts.endpoint, opts.tokens, 1))  # warm-up: compile, caches, channels
        before = {label: snapshot(pid) for label, pid in processes.items()}
        start = time.monotonic()
        tokens, chunks = asyncio.run(_streams(server.base_url, opts.endpoint, opts.tokens, opts.streams))
        wall = time.monotonic() - start
        after = {label: snapshot(pid) for label, pid in processes.items()}
    rows = []
    for label, pid in processes.items():
        for snap in (before[label], after[label]):  # the main thread apart from grpc's unnamed poller
            if pid in snap:
                snap[pid] = ("main", snap[pid][1])
        for name, s in sorted(by_thread_name(before[label], after[label]).items(), key=lambda kv: -kv[1].cpu_s):
            rows.append({"process": label, "thread": name, "cpu_s": s.cpu_s, "voluntary": s.voluntary,
                         "involuntary": s.involuntary})
    return {"model": model, "endpoint": opts.endpoint, "serve_flags": opts.serve_flag, "streams": opts.streams,
            "tokens": tokens, "chunks": chunks, "wall_s": wall, "threads": rows}


def summary(doc: dict[str, object]) -> dict[str, float]:
    """CPU ms per token: per process outside the engine row, the engine row, and the path's total."""
    tokens = max(int(doc["tokens"]), 1)  # type: ignore[arg-type]
    out: dict[str, float] = defaultdict(float)
    for r in doc["threads"]:  # type: ignore[union-attr]
        ms = 1e3 * r["cpu_s"] / tokens
        if r["thread"] == ENGINE:
            out["engine (forward + step)"] += ms
        else:
            out[f"{r['process']} (serving)"] += ms
            out["serving path total"] += ms
    return dict(out)


def format_doc(doc: dict[str, object]) -> str:
    tokens = max(int(doc["tokens"]), 1)  # type: ignore[arg-type]
    lines = [f"{doc['tokens']} tokens in {doc['chunks']} content chunks over {doc['streams']} batch-1 streams, "
             f"{float(doc['wall_s']):.2f} s wall ({doc['endpoint']})",  # type: ignore[arg-type]
             f"{'process':<10}{'thread':<18}{'CPU s':>8}{'ms/token':>10}{'sleeps/tok':>11}{'preempt/tok':>12}"]
    for r in doc["threads"]:  # type: ignore[union-attr]
        if r["cpu_s"] <= 0 and r["voluntary"] == 0:
            continue
        lines.append(f"{r['process']:<10}{r['thread']:<18}{r['cpu_s']:>8.2f}{1e3 * r['cpu_s'] / tokens:>10.3f}"
                     f"{r['voluntary'] / tokens:>11.2f}{r['involuntary'] / tokens:>12.2f}")
    lines.append("")
    for key, ms in summary(doc).items():
        lines.append(f"{key:<28}{ms:>8.3f} ms/token")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.studies.serving.serving_path_cost",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model folder or .gguf (default: the tiny model)")
    p.add_argument("--tokens", type=int, default=256, help="tokens per stream")
    p.add_argument("--streams", type=int, default=4, help="measured streams, one at a time")
    p.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    p.add_argument("--serve-flag", action="append", default=[], help="a `kvserve serve` argument (repeatable)")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE")
    return p


def main(argv: list[str] | None = None) -> int:
    if not sys.platform.startswith("linux"):
        print("serving_path_cost reads /proc: Linux only", file=sys.stderr)
        return 2
    opts = build_parser().parse_args(argv)
    doc = measure(opts)
    doc["summary_ms_per_token"] = summary(doc)
    print(format_doc(doc))
    if opts.json_path:
        with open(opts.json_path, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {opts.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
