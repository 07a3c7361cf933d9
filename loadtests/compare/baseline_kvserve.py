"""Baselines (c) and (d): kvserve itself, offline and over HTTP.

(c) `LLM.generate` on every prompt at once: the continuous-batching engine
    with nothing in front of it. To get per-request token times without
    changing the engine, the run wraps this one engine's `step()` (an instance
    attribute, removed afterwards) and timestamps every delta it returns; the
    duration is still that of the `generate()` call.
(d) `kvserve serve` as a child process on a free port (or a server the user
    points at with `--base-url`), driven by the benchmark's own streaming
    client: the full path a user pays for (HTTP, SSE, gateway, gRPC, engine).
"""
from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import aiohttp

from kvserve.loadtests.bench.bench_request import BenchRequest
from kvserve.loadtests.bench.client import EndpointConfig
from kvserve.loadtests.compare import CompareUnavailable
from kvserve.loadtests.compare.compare_prompts import CompareRequest
from kvserve.loadtests.compare.compare_result import BaselineRun, TokenClock
from kvserve.loadtests.bench.runner import LoadConfig, run_load
from kvserve.loadtests.bench.server_api import auth_headers, first_model

_READY = re.compile(r"kvserve gateway ready (http://\S+)")


def make_llm(model_dir: str, engine_args: dict[str, Any]) -> Any:
    from kvserve.backend import LLM, SamplingParams

    llm = LLM(model=model_dir, **engine_args)
    # Lazy initialisation is not the workload's cost (the HF baselines warm up too).
    llm.generate([list(range(1, 9))], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    return llm


def run_offline(llm: Any, requests: Sequence[CompareRequest]) -> BaselineRun:
    from kvserve.backend import SamplingParams

    params = [SamplingParams(max_tokens=r.output_len, temperature=0.0, ignore_eos=True) for r in requests]
    engine = llm.engine
    inner = engine.step
    seen: dict[str, list[float]] = {}
    finished: dict[str, float] = {}
    peak = 0

    def timed_step() -> list[Any]:
        nonlocal peak
        outputs = inner()
        now = time.perf_counter()
        sampled = 0
        for out in outputs:
            new = sum(len(c.token_ids) for c in out.outputs)
            if new:
                sampled += 1
                seen.setdefault(out.request_id, []).extend([now] * new)
            if out.finished:
                finished[out.request_id] = now
        peak = max(peak, sampled)
        return outputs

    engine.step = timed_step
    try:
        clock = TokenClock()
        results = llm.generate([list(r.prompt_ids) for r in requests], params)
        duration = time.perf_counter() - clock.start
    finally:
        del engine.step  # back to the class's method
    token_ids: dict[int, list[int]] = {}
    for r, res in zip(requests, results):
        clock.token_times(r.index, seen.get(res.request_id, []))
        if res.request_id in finished:
            clock.finish(r.index, at=finished[res.request_id])
        token_ids[r.index] = list(res.outputs[0].token_ids)
    records = [clock.record(r.index, r.prompt_len) for r in requests]
    config = engine.config
    return BaselineRun(
        "c", "kvserve-offline", "kvserve LLM.generate, all prompts at once", records, duration, len(requests),
        peak_concurrency=peak, token_ids=token_ids,
        extra={"engine": {"max_num_seqs": config.max_num_seqs,
                          "max_num_batched_tokens": config.max_num_batched_tokens,
                          "block_size": config.block_size, "dtype": str(engine.runner.dtype).removeprefix("torch."),
                          "device": str(engine.runner.device), "num_kv_blocks": engine.runner.num_blocks}},
    )


class ServeProcess:
    """`kvserve serve` in a child process, for the length of a `with` block.

    Port 0 lets the gateway bind a free port itself (no race with other
    programs); its ready line says which. Output goes to a file, not a pipe, so
    a chatty server can never block on a full pipe while we wait."""

    def __init__(self, model_dir: str, serve_flags: Sequence[str], startup_timeout_s: float = 600.0,
                 extra_env: Mapping[str, str] | None = None) -> None:
        self.extra_env = dict(extra_env or {})  # on top of this process's environment
        self.command = [sys.executable, "-m", "kvserve.frontend.cli", "serve", "--model", model_dir,
                        "--host", "127.0.0.1", "--port", "0", *serve_flags]
        self.startup_timeout_s = startup_timeout_s
        self.base_url = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_dir = tempfile.TemporaryDirectory(prefix="kvserve-compare-")
        self.log_path = Path(self._log_dir.name) / "serve.log"

    def __enter__(self) -> "ServeProcess":
        log = open(self.log_path, "wb")
        env = {**os.environ, **self.extra_env, "PYTHONUNBUFFERED": "1"}
        # A keyless server: the client sends --api-key/$OPENAI_API_KEY only if the user set one.
        env.pop("KVSERVE_API_KEY", None)
        self._proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                      env=env, start_new_session=True)
        log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        try:
            while time.monotonic() < deadline:
                match = _READY.search(self.log_path.read_text(errors="replace"))
                if match:
                    self.base_url = match.group(1)
                    return self
                if self._proc.poll() is not None:
                    raise CompareUnavailable(f"kvserve serve exited with {self._proc.returncode}:\n{self.tail()}")
                time.sleep(0.2)
            raise CompareUnavailable(f"kvserve serve not ready after {self.startup_timeout_s:.0f}s:\n{self.tail()}")
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        """The gateway's process id (the engine host is its child)."""
        if self._proc is None:
            raise RuntimeError("the server is not running")
        return self._proc.pid

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM lets the gateway stop its engine host in order; SIGKILL only if it hangs."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._log_dir.cleanup()


async def _serve_run(base_url: str, api_key: str | None, requests: list[BenchRequest],
                     load: LoadConfig) -> tuple[str, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        model = await first_model(session, base_url, auth_headers(api_key))
    endpoint = EndpointConfig(base_url=base_url, model=model, endpoint_type="completions", api_key=api_key,
                              ignore_eos=True, temperature=0.0)
    warm = BenchRequest(-1, list(range(1, 9)), 8, 2, exact_len=True)  # type: ignore[arg-type]
    await run_load([warm], endpoint, LoadConfig(show_progress=False, request_timeout_s=load.request_timeout_s))
    return model, await run_load(requests, endpoint, load)


def run_served(base_url: str, api_key: str | None, requests: Sequence[CompareRequest], load: LoadConfig,
               started_here: bool) -> BaselineRun:
    model, result = asyncio.run(_serve_run(base_url, api_key, [r.as_bench_request() for r in requests], load))
    by_index = {r.index: r for r in requests}
    ok = [rec for rec in result.records if rec.success]
    return BaselineRun(
        "d", "kvserve-serve", "kvserve serve over HTTP (streaming client)", result.records, result.duration,
        len(requests), peak_concurrency=result.max_in_flight,
        extra={"base_url": base_url, "started_server": started_here, "served_model": model,
               # The server's usage says how long it thought each prompt was: must be ours exactly.
               "prompt_tokens_match": all(rec.prompt_tokens == by_index[rec.index].prompt_len for rec in ok),
               "output_tokens_match": all(rec.output_tokens == by_index[rec.index].output_len for rec in ok)},
    )
