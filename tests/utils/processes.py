"""Start kvserve processes for end-to-end tests and read their metrics."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
_READY = re.compile(r"kvserve-host ready grpc=(\S+) metrics=(\S+)")


@dataclass
class HostProcess:
    proc: subprocess.Popen
    grpc_url: str
    metrics_url: str
    output: list[str] = field(default_factory=list)

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://{self.metrics_url}/metrics", timeout=5) as resp:
            return resp.read().decode()

    def metric(self, name: str) -> float:
        """Sum of every series of `name` (a gauge with one series is just its value)."""
        total, found = 0.0, False
        for line in self.metrics_text().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
                found = True
        if not found:
            raise KeyError(name)
        return total


def _pump(stream, sink: list[str]) -> None:
    for line in stream:
        sink.append(line)


@contextmanager
def run_host(engine_env: dict[str, str], repository: Path = MODEL_REPOSITORY, timeout: float = 120.0,
             models: tuple[str, ...] | None = None):
    """`python -m kvserve.backend.host` on free ports with KVSERVE_* engine variables,
    loading only `models` of the repository; by default every model of a test repository,
    and only `llm` of kvserve's own (its `embed` model serves when asked for)."""
    if models is None and repository == MODEL_REPOSITORY:
        models = ("llm",)
    env = dict(os.environ, **engine_env)
    env.setdefault("OTEL_TRACES_EXPORTER", "none")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvserve.backend.host", "--model-repository", str(repository),
         "--grpc-port", "0", "--metrics-port", "0",
         *(["--model-control-mode", "explicit", *(a for m in models for a in ("--load-model", m))]
           if models is not None else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO_ROOT)
    output: list[str] = []
    deadline = time.monotonic() + timeout
    match = None
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            output.append(line)
            match = _READY.search(line)
            if match:
                break
        if match is None:
            raise RuntimeError("host did not become ready:\n" + "".join(output[-40:]))
        threading.Thread(target=_pump, args=(proc.stdout, output), daemon=True).start()
        yield HostProcess(proc, match.group(1), match.group(2), output)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kill_process_group(proc: subprocess.Popen) -> None:
    """SIGKILL a process started with start_new_session=True and everything in its group, then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)
