"""The locustfile: shapes as pure functions, and one short headless run.

locust monkey-patches the standard library with gevent when imported, so it
only ever runs in a subprocess here, never in the pytest process."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvserve.loadtests.bench.sustained.load_shapes import ShapeConfig, ramp, selected_shape, spike, steady

LOCUSTFILE = Path(__file__).resolve().parents[2] / "loadtests" / "bench" / "sustained" / "locustfile.py"
CFG = ShapeConfig(users=10, spawn_rate=2, duration=100, spike_users=40, spike_at=30, spike_len=10)


def test_steady_holds_then_stops():
    assert steady(0, CFG) == steady(99, CFG) == (10, 2)
    assert steady(100, CFG) is None


def test_ramp_grows_to_peak_and_holds():
    users = [ramp(t, CFG)[0] for t in range(0, 100, 5)]
    assert users[0] == 1 and users == sorted(users)
    assert ramp(80, CFG)[0] == ramp(99, CFG)[0] == 10 and ramp(40, CFG)[0] == 5
    assert ramp(100, CFG) is None


def test_spike_jumps_and_recovers():
    assert spike(29.9, CFG)[0] == 10
    assert spike(30, CFG) == (40, 40.0) and spike(39.9, CFG)[0] == 40
    assert spike(40, CFG)[0] == 10
    assert spike(100, CFG) is None


def test_shape_selection_from_env():
    assert selected_shape({}) is None
    assert selected_shape({"KVSERVE_LOAD_SHAPE": "Spike"}) is spike
    with pytest.raises(ValueError, match="steady, ramp, spike"):
        selected_shape({"KVSERVE_LOAD_SHAPE": "wave"})
    cfg = ShapeConfig.from_env({"KVSERVE_USERS": "3", "KVSERVE_DURATION": "7.5"})
    assert (cfg.users, cfg.duration, cfg.spike_users) == (3, 7.5, ShapeConfig().spike_users)


def test_headless_locust_reports_ttft_and_itl(fake_server, tmp_path):
    server = fake_server(delay_s=0.004)
    env = {**os.environ, "KVSERVE_LOAD_SHAPE": "steady", "KVSERVE_USERS": "2", "KVSERVE_DURATION": "2",
           "KVSERVE_MAX_TOKENS": "5", "KVSERVE_PROMPT_WORDS": "10"}
    proc = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", server.url,
         "--csv", str(tmp_path / "run"), "--only-summary", "--loglevel", "WARNING"],
        env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(open(tmp_path / "run_stats.csv"))}
    for label in ("chat", "completions"):
        ttft, itl, e2e = rows[("TTFT", label)], rows[("ITL", label)], rows[("E2E", label)]
        n = int(ttft["Request Count"])
        assert n > 0 and int(e2e["Request Count"]) == n
        assert int(itl["Request Count"]) == 4 * n  # 5 content chunks -> 4 gaps each
        assert float(ttft["Average Response Time"]) >= 15  # the fake's 20 ms prefill
        assert float(ttft["Average Response Time"]) < float(e2e["Average Response Time"])
        assert int(ttft["Failure Count"]) == 0
    assert any("messages" in b for b in server.bodies) and any("prompt" in b for b in server.bodies)
    assert all(b["ignore_eos"] is True and b["max_tokens"] == 5 for b in server.bodies)
