"""`kvserve serve` as a real process for the reliability tests: start it on a
free port, keep its logs (gateway and embedded host share its stderr), read
its metrics, talk plain HTTP to it, stop it and check nothing is left behind.

Every network call has a timeout, so no test can hang on a broken server.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[2]
PICKLE_GUARD_DIR = Path(__file__).resolve().parent / "pickle_guard"
HTTP_TIMEOUT_S = 30.0


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Served:
    proc: subprocess.Popen
    url: str
    host: str
    port: int
    backend: str  # the embedded host's gRPC address, from the ready line
    api_key: str | None
    logs: list[str] = field(default_factory=list)  # stderr lines of the gateway and the host
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- process ----------------------------------------------------------------------------
    def host_pids(self) -> list[int]:
        try:
            return [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def log_mark(self) -> int:
        with self._lock:
            return len(self.logs)

    def logs_since(self, mark: int) -> list[str]:
        with self._lock:
            return list(self.logs[mark:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        for pid in self.host_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    # ---- HTTP -------------------------------------------------------------------------------
    def auth(self, key: str | None = "default") -> dict[str, str]:
        key = self.api_key if key == "default" else key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def request(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
                headers: dict[str, str] | None = None, key: str | None = "default",
                timeout: float = HTTP_TIMEOUT_S) -> Reply:
        hdrs = {**self.auth(key), **(headers or {})}
        data = raw
        if data is None and body is not None:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()

    def get(self, path: str, **kw: Any) -> Reply:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Reply:
        return self.request("POST", path, body, **kw)

    def complete(self, **body: Any) -> dict:
        reply = self.post("/v1/completions", body)
        assert reply.status == 200, (reply.status, reply.body[:300])
        return reply.json()

    # ---- metrics ----------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """Every backend/gateway series summed by metric name (labels dropped)."""
        text = self.get("/metrics", key=None).body.decode()
        out: dict[str, float] = {}
        for m in re.finditer(r"^([a-zA-Z_:][\w:]*)(?:\{[^}]*\})? (\S+)$", text, re.M):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
        return out

    def engine_state(self) -> tuple[float, float, float]:
        m = self.metrics()
        return (m["kvserve:num_requests_running"], m["kvserve:num_requests_waiting"],
                m["kvserve:kv_cache_usage_perc"])

    def wait_idle(self, within_s: float) -> tuple[float, float, float]:
        """Poll until running = waiting = KV usage = 0 or `within_s` passed; returns the last state."""
        deadline = time.monotonic() + within_s
        state = self.engine_state()
        while state != (0, 0, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
            state = self.engine_state()
        return state


def _pump(stream, sink: list[str], lock: threading.Lock) -> None:
    for line in stream:
        with lock:
            sink.append(line)


def start_served(args: list[str], *, api_key: str | None = None, env: dict[str, str] | None = None,
                 timeout: float = 180.0) -> Served:
    """`kvserve serve --port 0 ARGS`; returns once the gateway printed its ready line."""
    full_env = {**os.environ, "OTEL_TRACES_EXPORTER": "none", **(env or {})}  # `env` may turn tracing on
    full_env.pop("KVSERVE_API_KEY", None)
    cmd = [sys.executable, "-m", "kvserve.frontend.cli", "serve", "--port", "0", "--log-format", "json", *args]
    if api_key:
        cmd += ["--api-key", api_key]
    proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, encoding="utf-8", errors="replace")
    logs: list[str] = []
    lock = threading.Lock()
    threading.Thread(target=_pump, args=(proc.stderr, logs, lock), daemon=True).start()
    ready: list[str] = []

    def read_ready() -> None:
        for line in proc.stdout:
            if line.startswith("kvserve gateway ready"):
                ready.append(line)
                break
        for _ in proc.stdout:  # keep draining so the pipe never fills
            pass

    threading.Thread(target=read_ready, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not ready and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not ready:
        if proc.poll() is None:
            proc.kill()
        with lock:
            tail = "".join(logs[-30:])
        raise RuntimeError(f"kvserve serve did not become ready (exit {proc.poll()}):\n{tail}")
    # kvserve gateway ready http://127.0.0.1:PORT model=NAME backend=HOST:PORT
    words = ready[0].split()
    url = words[3]
    backend = next(w.split("=", 1)[1] for w in words if w.startswith("backend="))
    host, port = url.removeprefix("http://").rsplit(":", 1)
    served = Served(proc, url, host, int(port), backend, api_key, logs, lock)
    return served
