"""`kvserve serve` as a subprocess for end-to-end tests: started from the repository, read up to
its ready line, stopped with SIGTERM (the way a deployment stops it) and killed if it hangs."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[1]
READY = "kvserve gateway ready"  # then: URL model=NAME backend=HOST:PORT


@contextlib.contextmanager
def kvserve_serve(args: list[str], *, timeout_s: float, check_exit: bool = True
                  ) -> Iterator[tuple[subprocess.Popen, str]]:
    """Yields (process, ready line); with `check_exit`, a SIGTERM must end it with status 0."""
    env = dict(os.environ, OTEL_TRACES_EXPORTER="none")
    proc = subprocess.Popen([sys.executable, "-m", "kvserve.frontend.cli", "serve", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line, deadline = "", time.monotonic() + timeout_s
        while time.monotonic() < deadline and not line.startswith(READY):
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                pytest.fail(f"kvserve serve exited with {proc.returncode}")
        assert line.startswith(READY), line
        yield proc, line
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
            if check_exit:
                assert code == 0
        finally:
            if proc.poll() is None:
                proc.kill()
