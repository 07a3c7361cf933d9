"""The embedded Triton-compatible host as a child process of `kvserve serve`.

The engine runs in its own process, as under tritonserver: it never competes
with the gateway's event loop for the GIL. The child must never outlive us:
- it gets `--parent-pid` and exits when that process is gone (its own check);
- on Linux, PR_SET_PDEATHSIG sends it SIGTERM if we die, even by SIGKILL;
- it runs in its own session, so a terminal's Ctrl-C reaches only us and we
  stop it in order (HTTP first, then the engine) with `stop()`.
"""
from __future__ import annotations

import ctypes
import logging
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Sequence

log = logging.getLogger("kvserve.frontend.host")

READY_LINE = re.compile(r"kvserve-host ready grpc=(\S+) metrics=(\S+)")
_PR_SET_PDEATHSIG = 1
# Loaded here, in the parent: the child between fork and exec should only call it.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


@dataclass(slots=True, frozen=True)
class HostAddress:
    grpc: str
    metrics: str


class HostStartError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def host_command(model_repository: str, grpc_port: int, metrics_port: int,
                 load_models: Sequence[str] = ("llm",)) -> list[str]:
    """Only the models named are loaded (tritonserver's explicit model control): the
    repository holds the embed model too, which serves only when asked for."""
    return [
        sys.executable, "-m", "kvserve.backend.host",
        "--model-repository", model_repository,
        "--grpc-port", str(grpc_port),
        "--metrics-port", str(metrics_port),
        "--parent-pid", str(os.getpid()),
        "--model-control-mode", "explicit",
        *(arg for name in load_models for arg in ("--load-model", name)),
    ]


def _die_with_parent() -> None:
    # Runs in the child between fork and exec.
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


class HostProcess:
    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self._command = command
        self._env = env
        self._proc: subprocess.Popen[str] | None = None
        self._ready: queue.Queue[HostAddress | None] = queue.Queue()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout_s: float) -> HostAddress:
        """Start the child and wait for its ready line (model loading takes a while)."""
        self._proc = subprocess.Popen(
            self._command,
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=None,  # the host's logs go straight to our stderr
            text=True,
            bufsize=1,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        threading.Thread(target=self._read_stdout, name="kvserve-host-stdout", daemon=True).start()
        try:
            address = self._ready.get(timeout=timeout_s)
        except queue.Empty:
            self.stop()
            raise HostStartError(f"the embedded host was not ready within {timeout_s:.0f} s") from None
        if address is None:
            code = self._proc.wait()
            raise HostStartError(f"the embedded host exited with code {code} before it was ready (see its log above)")
        return address

    def _read_stdout(self) -> None:
        # Keeps draining after the ready line: a full pipe would block the child.
        assert self._proc is not None and self._proc.stdout is not None
        announced = False
        for line in self._proc.stdout:
            match = None if announced else READY_LINE.search(line)
            if match:
                announced = True
                self._ready.put(HostAddress(grpc=match.group(1), metrics=match.group(2)))
            else:
                sys.stdout.write(line)
                sys.stdout.flush()
        if not announced:
            self._ready.put(None)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace_s`; returns the exit code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.warning("embedded host did not stop within %.0f s; killing it", grace_s)
                proc.kill()
                proc.wait()
        return proc.returncode
