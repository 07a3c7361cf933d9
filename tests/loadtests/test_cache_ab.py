"""The prefix-caching A/B harness: two live servers, alternating rounds, and
the caching server's own counters proving that nothing hit."""
from __future__ import annotations

import json

from kvserve.loadtests.studies.cache_ab import main, summarize


def test_summary_ratios():
    rounds = [{"on": {"output_throughput": 90.0, "duration_s": 10.0, "cached_tokens": 0.0, "failed": 0.0},
               "off": {"output_throughput": 100.0, "duration_s": 9.0, "cached_tokens": 0.0, "failed": 0.0}},
              {"on": {"output_throughput": 110.0, "duration_s": 8.0, "cached_tokens": 0.0, "failed": 0.0},
               "off": {"output_throughput": 100.0, "duration_s": 9.0, "cached_tokens": 0.0, "failed": 0.0}}]
    s = summarize(rounds)
    assert s["median_ratio"] == s["mean_ratio"] == 1.0
    assert (s["min_ratio"], s["max_ratio"]) == (0.9, 1.1)
    assert s["total_time_ratio"] == 1.0 and s["failed"] == 0


def test_two_live_servers_alternate_and_caching_server_never_hits(llama_dir, tmp_path, capsys):
    out = tmp_path / "ab.json"
    rc = main(["--model", llama_dir, "--rounds", "2", "--num-prompts", "4", "--input-len", "40",
               "--output-len", "4", "--json", str(out), "--startup-timeout", "120"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "on ran first" in printed and "off ran first" in printed
    doc = json.loads(out.read_text())
    assert len(doc["rounds"]) == 2
    for row in doc["rounds"]:
        for arm in ("on", "off"):
            assert (row[arm]["completed"], row[arm]["failed"]) == (4, 0)
        # Fresh prompts every round: the caching server looked them all up and found nothing.
        assert row["on"]["prompt_tokens_looked_up"] >= 4 * 40 and row["on"]["cached_tokens"] == 0
        assert row["off"]["prompt_tokens_looked_up"] == 0
    assert doc["summary"]["median_ratio"] > 0
