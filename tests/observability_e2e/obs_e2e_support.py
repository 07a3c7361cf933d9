"""`kvserve serve` as a real process pair (gateway + embedded host) for the
observability end-to-end tests: traces to an in-test OTLP receiver, the log
lines of both processes (the host's stderr is the gateway's), /metrics.

Every server here has a KV cache of 8 blocks of 16 tokens, so two long
requests at once preempt one another.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.utils.otlp_receiver import OTLPReceiver

REPO = Path(__file__).resolve().parents[2]

MODEL = "obs-tiny"
CHAT = "/v1/chat/completions"
# Small on purpose: 8 usable blocks x 16 tokens = 128 tokens = max_model_len.
KV_ARGS = ["--max-model-len", "128", "--block-size", "16", "--num-kv-blocks", "9", "--max-num-seqs", "4"]


def new_traceparent() -> tuple[str, str, str]:
    """(header, trace id, span id) of a fresh sampled client span."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, receiver: OTLPReceiver | None) -> None:
        self.proc, self.url, self.receiver = proc, url, receiver
        self.stderr: list[str] = []
        self._lock = threading.Lock()

    # --- logs: both processes write to this stderr ---
    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._lock:
                self.stderr.append(line.rstrip("\n"))

    def log_lines(self) -> list[str]:
        with self._lock:
            return [line for line in self.stderr if line.strip()]

    def wait_for_log(self, predicate, timeout: float = 10.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.log_lines()
            if any(predicate(line) for line in lines):
                return lines
            time.sleep(0.05)
        raise AssertionError("no such log line; last lines:\n" + "\n".join(self.log_lines()[-20:]))

    # --- HTTP ---
    def request(self, method: str, path: str, body: dict | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def chat(self, body: dict, headers: dict[str, str] | None = None) -> dict:
        status, _, raw = self.request("POST", CHAT, {"model": MODEL, **body}, headers)
        assert status == 200, raw
        return json.loads(raw)

    def stream_chat(self, body: dict, headers: dict[str, str] | None = None) -> list[dict]:
        """The SSE chunks of a streamed chat completion, [DONE] checked and dropped."""
        status, _, raw = self.request("POST", CHAT, {"model": MODEL, "stream": True, **body}, headers)
        assert status == 200, raw
        events = [line[len("data: "):] for line in raw.decode().splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", events[-3:]
        return [json.loads(e) for e in events[:-1]]

    def metrics(self) -> str:
        status, _, raw = self.request("GET", "/metrics")
        assert status == 200
        return raw.decode()


def metric_value(text: str, sample: str, **labels: str) -> float:
    """Sum of the samples called `sample` whose labels include `labels` (0 if none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "KVSERVE_"))}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


@contextmanager
def run_server(model_dir: str, args: list[str], env: dict[str, str],
               receiver: OTLPReceiver | None = None) -> Iterator[Server]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvserve.frontend.cli", "serve", "--model", model_dir, "--port", "0",
         "--served-model-name", MODEL, *KV_ARGS, *args],
        cwd=REPO, env=_clean_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    server: Server | None = None
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        line = ""
        while time.monotonic() < deadline and not line.startswith("kvserve gateway ready"):
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                pytest.fail(f"kvserve serve exited with {proc.returncode}: {proc.stderr.read()[-3000:]}")
        assert line.startswith("kvserve gateway ready"), line
        server = Server(proc, line.split()[3], receiver)
        threading.Thread(target=server._pump, daemon=True).start()
        threading.Thread(target=lambda: proc.stdout.read(), daemon=True).start()
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
