"""Fixtures for the benchmark tests; the fake server lives in fake_openai_server.py."""
from __future__ import annotations

from typing import Any, Iterator

import pytest

from fake_openai_server import FakeServer


@pytest.fixture
def fake_server():
    """Factory: `fake_server(fail_every=4)` returns a running FakeServer."""
    stack: list[Iterator[FakeServer]] = []

    def start(**kwargs: Any) -> FakeServer:
        gen = FakeServer(**kwargs).serve_in_thread()
        stack.append(gen)
        return next(gen)

    yield start
    for gen in stack:
        gen.close()
