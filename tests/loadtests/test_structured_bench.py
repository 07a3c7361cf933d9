"""The structured-outputs benchmark runs end to end (tiny model, one short round): every arm's
streams reach max_tokens, the ratios and compile percentiles are there."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("xgrammar")

from kvserve.loadtests.studies import structured_bench


@pytest.mark.slow
def test_structured_bench_one_round(llama_dir, tmp_path):
    out = tmp_path / "structured.json"
    assert structured_bench.main(["--model", llama_dir, "--rounds", "1", "--max-tokens", "6",
                                  "--compile-repeats", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    comp = doc["compile"]
    assert comp["schemas"] == 20 and comp["samples"] == 20
    assert 0 < comp["cached_ms"]["p50"] <= comp["cold_ms"]["p50"] and comp["cold_ms"]["p50"] <= comp["cold_ms"]["p99"]
    serving = doc["serving"]
    assert set(serving["rounds"][0]) == {"free16", "mixed15+1", "json16"}
    assert all(arm["min_tokens"] == 6 for arm in serving["rounds"][0].values())  # constrained ones too
    for key in ("mixed_free_vs_free16", "mixed_total_vs_free16", "json16_vs_free16"):
        assert serving[key] > 0
