"""Helpers for the embedded-host tests: a host running in-process on its own
event-loop thread (so the blocking tritonclient can call it from the test
thread), and small readers of its HTTP endpoints."""
from __future__ import annotations

import asyncio
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Coroutine

from kvserve.backend.host import HostHandle, start_host

REPOS = Path(__file__).parent / "repositories"
BASIC = REPOS / "basic"


class HostThread:
    """start_host() on a private loop in a daemon thread."""

    def __init__(self, repository: Path, **kwargs: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-host-loop", daemon=True)
        self._thread.start()
        self.handle: HostHandle = self.run(start_host(repository, **kwargs))

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        try:
            self.run(self.handle.stop(grace=0.5))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metrics_text(handle: HostHandle) -> str:
    status, body = http_get(handle.metrics_url or "")
    assert status == 200
    return body


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sample `name{labels...}` (labels matched exactly); 0 when absent."""
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        found = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if found == labels:
            return float(m.group(3))
    return 0.0
