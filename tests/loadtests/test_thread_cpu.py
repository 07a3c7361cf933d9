"""thread_cpu: per-thread CPU of a live kvserve serve during one bench run,
with the engine's threads named at the OS level."""
from __future__ import annotations

import json
import sys

import pytest

from kvserve.loadtests.studies.thread_cpu import main

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_thread_accounting_of_a_live_server(llama_dir, tmp_path, capsys):
    out = tmp_path / "threads.json"
    # Enough tokens that the engine's CPU shows in /proc's 10 ms ticks: 32 tokens of the tiny model
    # took ~20 ms and could read as 0.
    rc = main(["--model", llama_dir, "--json", str(out), "--", "--dataset-name", "random", "--num-prompts", "8",
               "--random-input-len", "64", "--random-output-len", "64"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["output_tokens"] == 512
    rows = {(r["process"], r["thread"]): r for r in doc["threads"]}
    engine = rows[("host-0", "kvserve-engine")]  # the engine thread and its OpenMP workers
    assert engine["cpu_s"] > 0 and engine["voluntary"] >= 0
    assert ("host-0", "kvserve-respond") in rows
    assert any(p == "gateway" for p, _ in rows) and rows[("bench client", "(all)")]["cpu_s"] > 0
    assert "us/token" in capsys.readouterr().out
