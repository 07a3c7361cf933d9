"""The contention harness: the engine alone and beside a CPU-busy process,
alternating, with the busy process's own CPU time measured."""
from __future__ import annotations

import json

import pytest

from kvserve.loadtests.studies.contention import main, summarize


def test_summary_relates_lost_throughput_to_machine_share():
    rounds = [{"alone": {"output_throughput": 100.0, "duration_s": 10.0, "busy_cpu_s": 0.0},
               "busy": {"output_throughput": 90.0, "duration_s": 10.0, "busy_cpu_s": 1.0}},
              {"alone": {"output_throughput": 100.0, "duration_s": 10.0, "busy_cpu_s": 0.0},
               "busy": {"output_throughput": 80.0, "duration_s": 10.0, "busy_cpu_s": 1.0}}]
    s = summarize(rounds, cores=2)
    assert s["median_ratio"] == pytest.approx(0.85)
    assert (s["min_ratio"], s["max_ratio"]) == (0.8, 0.9)
    assert s["busy_share_of_machine"] == pytest.approx(0.05)  # 1 CPU s of 2 cores x 10 s
    assert s["loss_per_share"] == pytest.approx(3.0)  # 15 % lost for 5 % taken


def test_live_rounds_alternate_and_measure_the_busy_process(llama_dir, tmp_path, capsys):
    out = tmp_path / "contention.json"
    rc = main(["--model", llama_dir, "--rounds", "2", "--num-prompts", "4", "--input-len", "16",
               "--range-ratio", "0", "--output-median", "48", "--output-max", "64", "--busy", "0.5",
               "--period-ms", "10", "--json", str(out)])
    assert rc == 0
    err = capsys.readouterr().err
    assert "(alone first)" in err and "(busy first)" in err
    doc = json.loads(out.read_text())
    assert len(doc["rounds"]) == 2
    for row in doc["rounds"]:
        # Spinning half of every 10 ms: about half a core for the length of the run.
        assert row["alone"]["busy_cpu_s"] == 0.0
        assert 0.0 < row["busy"]["busy_cpu_s"] <= row["busy"]["duration_s"] + 0.05
        assert row["alone"]["output_throughput"] > 0 and row["busy"]["output_throughput"] > 0
    assert 0 < doc["summary"]["busy_share_of_machine"] <= 1


def test_rejects_a_busy_share_outside_0_1(capsys):
    assert main(["--busy", "1.5"]) == 2
    assert "--busy" in capsys.readouterr().err
