"""Fixtures for the observability tests: a clean OTEL_* environment, and
tracing/logging state reset after each test (both are process-global)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest
import structlog

# `tests.utils` must import under a bare `pytest` too, not only `python -m pytest`.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from kvserve.observability import logging as obs_logging  # noqa: E402
from kvserve.observability import shutdown_tracing  # noqa: E402
from tests.utils.otlp_receiver import OTLPReceiver  # noqa: E402


@pytest.fixture(autouse=True)
def clean_observability_env(monkeypatch: pytest.MonkeyPatch):
    for key in list(os.environ):
        if key.startswith("OTEL_") or key.startswith("KVSERVE_LOG"):
            monkeypatch.delenv(key)
    yield
    shutdown_tracing()
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, obs_logging._KvserveHandler)]:
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    obs_logging._log_requests = False
    structlog.reset_defaults()


@pytest.fixture
def receiver():
    with OTLPReceiver() as rx:
        yield rx
