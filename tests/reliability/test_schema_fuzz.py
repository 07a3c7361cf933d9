"""Schema fuzzing: schemathesis reads the gateway's own /openapi.json and throws
valid and invalid requests (positive and negative modes) at the live server.

Checks: no 5xx, every status and content type documented, every response
(JSON or SSE event) valid against the schema, invalid data rejected with a
4xx, auth not ignored, undocumented methods answered 405. Not checked:
"positive data accepted" (a schema-valid request may still be refused for a
reason a schema cannot express, e.g. prompt + max_tokens over the context).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.conftest import MAIN_KEY
from tests.reliability.served import Served

pytest.importorskip("schemathesis")


def _st() -> str:
    local = Path(sys.executable).parent / "st"
    return str(local) if local.exists() else (shutil.which("st") or "st")


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_and_no_schema_violation(main_server: Served, tmp_path: Path) -> None:
    cmd = [_st(), "run", f"{main_server.url}/openapi.json", "-H", f"Authorization: Bearer {MAIN_KEY}",
           "--checks", "all", "--exclude-checks", "positive_data_acceptance",
           "--mode", "all", "--max-examples", "30", "--seed", "20261130", "--workers", "1",
           "--request-timeout", "30", "--report", "junit", "--report-dir", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert " passed" in output and "generated" in output, output[-2000:]
    # The fuzzing left nothing behind in the engine.
    assert main_server.wait_idle(5.0) == (0, 0, 0)
