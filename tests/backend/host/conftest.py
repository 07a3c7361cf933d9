"""Fixtures shared by the embedded-host tests (helpers live in host_fixtures.py)."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest
from host_fixtures import BASIC, HostThread

from kvserve.backend.host import HostHandle


@pytest.fixture(scope="module")
def host() -> Iterator[HostHandle]:
    ht = HostThread(BASIC)
    yield ht.handle
    ht.stop()


@pytest.fixture
def healthy_repo(tmp_path: Path) -> Path:
    """A repository where every model loads (no `failing`)."""
    for name in ("add_sub", "echo", "repeat"):
        shutil.copytree(BASIC / name, tmp_path / name)
    return tmp_path


