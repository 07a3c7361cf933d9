"""Baseline (d): `kvserve serve` started by the compare run, the streaming
client against it, and its ratio to the offline engine on the same prompts."""
from __future__ import annotations

import json

from kvserve.loadtests.bench.bench_cli import main


def test_compare_starts_kvserve_serve_and_reports_d(llama_dir, tmp_path, capsys):
    out = tmp_path / "compare.json"
    rc = main(["--compare", "--model", llama_dir, "--compare-baselines", "c,d", "--num-prompts", "4",
               "--random-input-len", "8", "--random-output-len", "4", "--json", str(out), "--disable-tqdm",
               "--save-detailed", "--server-startup-timeout", "120"])
    assert rc == 0
    assert "(d) kvserve-serve, HTTP, rate inf" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    d = doc["baselines"]["d"]
    assert (d["completed"], d["failed"]) == (4, 0)
    assert d["started_server"] and d["base_url"].startswith("http://127.0.0.1:")
    # The server counted our token-id prompts and outputs exactly as we built them.
    assert d["prompt_tokens_match"] and d["output_tokens_match"]
    assert d["total_output_tokens"] == doc["baselines"]["c"]["total_output_tokens"] == 16
    assert d["total_input_tokens"] == doc["workload"]["total_input_tokens"] == 32
    assert 0 < d["p50_ttft_ms"] <= d["p99_e2el_ms"] and len(d["requests"]) == 4
    assert doc["ratios"]["d_over_c"] > 0


def test_compare_repeat_alternates_pairs_on_one_engine_and_server(llama_dir, tmp_path, capsys):
    out = tmp_path / "compare.json"
    rc = main(["--compare", "--model", llama_dir, "--compare-baselines", "c,d", "--compare-repeat", "3",
               "--num-prompts", "4", "--random-input-len", "8", "--random-output-len", "4", "--json", str(out),
               "--disable-tqdm", "--server-startup-timeout", "120"])
    assert rc == 0
    printed = capsys.readouterr()
    assert "(d)/(c) in 3 alternating pairs" in printed.out
    assert "pair 2/3: d then c" in printed.err
    doc = json.loads(out.read_text())
    repeats = doc["baselines"]["d"]["repeats"]
    assert [r["first"] for r in repeats] == ["c", "d", "c"]
    ratios = sorted(r["d_over_c"] for r in repeats)
    shown = repeats[doc["baselines"]["d"]["repeats_shown_pair"] - 1]
    assert shown["d_over_c"] == ratios[1] == doc["ratios"]["d_over_c"]
    assert doc["baselines"]["d"]["completed"] == doc["baselines"]["c"]["completed"] == 4
