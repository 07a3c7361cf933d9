"""Session fixtures of the observability end-to-end tests: the in-test OTLP
receiver and one traced `kvserve serve` (default logging: JSON, no prompts)."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:  # `tests.*` imports under a bare `pytest` too
    sys.path.insert(0, _ROOT)

from tests.observability_e2e.obs_e2e_support import Server, run_server  # noqa: E402
from tests.utils.otlp_receiver import OTLPReceiver  # noqa: E402


@pytest.fixture(scope="session")
def otlp() -> Iterator[OTLPReceiver]:
    with OTLPReceiver(protocol="http/protobuf") as rx:
        yield rx


@pytest.fixture(scope="session")
def traced_server(llama_dir: str, otlp: OTLPReceiver) -> Iterator[Server]:
    """Default logging (JSON, no prompts); both processes export spans over OTLP/HTTP
    to `otlp`, every 100 ms (OTEL_BSP_SCHEDULE_DELAY) rather than every 5 s."""
    env = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    with run_server(llama_dir, ["--otlp-traces-endpoint", otlp.endpoint], env, otlp) as server:
        yield server
