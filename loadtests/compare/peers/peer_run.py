"""Running the peers: one server at a time on a free port, each client on each
workload against it, then the server stopped before the next one starts (two
servers at once would share the cores and measure each other).

A server is ready when a one-token completion succeeds, not when it first
answers /v1/models: vLLM lists its model before its engine has compiled, and
llama-server answers 503 while it loads. The time to ready is recorded.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kvserve.loadtests.compare.peers.peer_commands import Command


def peer_arg(text: str) -> tuple[str, str]:
    """argparse type of a benchmark's --peer NAME=URL: a server already running (llama-server,
    vLLM-CPU) measured as one more side of the benchmark's rounds."""
    name, sep, url = text.partition("=")
    if not (name and sep and url):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=URL")
    return name, url.rstrip("/")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command_env(cmd: Command, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    for name in cmd.unset:
        env.pop(name, None)
    env.update(cmd.env)
    if cmd.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([*cmd.pythonpath, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _probe(base_url: str, model: str, timeout: float) -> bool:
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(f"{base_url}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass
class ServerProcess:
    """A server in a session of its own, so stopping it stops its children too
    (kvserve's embedded host, vLLM's engine core)."""

    name: str
    proc: subprocess.Popen
    log: Path
    base_url: str
    started: float

    @classmethod
    def start(cls, name: str, cmd: Command, port: int, log: Path) -> "ServerProcess":
        log.parent.mkdir(parents=True, exist_ok=True)
        print(f"peers: starting {name}: {' '.join(cmd.argv)}", file=sys.stderr, flush=True)
        with log.open("w") as out:
            proc = subprocess.Popen(cmd.argv, env=command_env(cmd), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        return cls(name, proc, log, f"http://127.0.0.1:{port}", time.monotonic())

    def wait_ready(self, model: str, timeout_s: float, probe: Callable[[str, str, float], bool] = _probe) -> float:
        """Seconds from start to the first successful completion; RuntimeError if
        the server exits or the deadline passes first."""
        deadline = self.started + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before it was ready; "
                                   f"see {self.log}")
            if probe(self.base_url, model, max(1.0, min(120.0, deadline - time.monotonic()))):
                return time.monotonic() - self.started
            time.sleep(1.0)
        raise RuntimeError(f"{self.name} was not ready after {timeout_s:.0f} s; see {self.log}")

    def stop(self, grace_s: float = 60.0) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
            except ProcessLookupError:
                pass
        # Children that outlived the leader (same process group) must not run into the next server.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def run_client(cmd: Command, log: Path, timeout_s: float) -> int:
    """The client's exit status (124 on timeout); its output goes to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"peers: $ {' '.join(cmd.argv)}", file=sys.stderr, flush=True)
    with log.open("w") as out:
        try:
            return subprocess.run(cmd.argv, env=command_env(cmd), stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            return 124
