"""Servers shared by the reliability tests (each is a real `kvserve serve`).

- `main_server`: the tiny llama test model, API keys for two tenants plus a
  default key, scheduling debug lines on, the pickle guard loaded in every
  process (gateway and host), and two names allowed in the Host header.
- `cycle_server`: the cycle model (known output, multi-byte characters), one
  sequence at a time and a waiting queue of 2: overload, timeouts, UTF-8.
Tests that need their own engine flags (KV budget, fault injection, SIGTERM)
start their own server in their module.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import tiny_model
from tests.reliability.cycle_model import make_cycle_model
from tests.reliability.served import PICKLE_GUARD_DIR, Served, start_served

MAIN_KEY = "sk-main-default"
TENANT_KEYS = {"sk-tenant-a": "tenant-a", "sk-tenant-b": "tenant-b"}
MAIN_MAX_MODEL_LEN = 256
MAIN_ALLOWED_HOSTS = ["api.kvserve.test", ".svc.kvserve.test"]


def _stop_clean(served: Served) -> None:
    code = served.stop(timeout=60)
    assert code == 0, f"kvserve serve exited with {code}"


@pytest.fixture(scope="session")
def pickle_audit_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pickle") / "unpickled.txt"
    path.write_text("")
    return path


@pytest.fixture(scope="session")
def main_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """XDG_STATE_HOME of main_server: where it generates and keeps the tenants' cache-salt secret."""
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="session")
def main_server(tmp_path_factory: pytest.TempPathFactory, pickle_audit_file: Path, main_state_dir: Path):
    keys_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys_file.write_text("# key tenant\n" + "".join(f"{k} {t}\n" for k, t in TENANT_KEYS.items()))
    env = {
        "KVSERVE_LOG_SCHEDULING": "true",
        "XDG_STATE_HOME": str(main_state_dir),  # not the user's home
        "KVSERVE_PICKLE_AUDIT": str(pickle_audit_file),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PICKLE_GUARD_DIR), os.environ.get("PYTHONPATH")])),
    }
    served = start_served(
        ["--model", tiny_model("llama"), "--served-model-name", "tiny", "--max-num-seqs", "16",
         "--max-model-len", str(MAIN_MAX_MODEL_LEN), "--api-keys-file", str(keys_file),
         "--max-request-body-bytes", "1MiB", "--allowed-hosts", json.dumps(MAIN_ALLOWED_HOSTS)],
        api_key=MAIN_KEY, env=env)
    try:
        yield served
    finally:
        _stop_clean(served)


@pytest.fixture(scope="session")
def cycle_server():
    served = start_served(["--model", make_cycle_model(), "--served-model-name", "cycle", "--max-num-seqs", "1",
                           "--max-waiting-requests", "2", "--max-model-len", "1024"])
    try:
        yield served
    finally:
        _stop_clean(served)
