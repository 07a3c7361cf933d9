"""`kvserve bench` against a live `kvserve serve`: every metric present, no failed request."""
from __future__ import annotations

import json

import pytest

from kvserve.loadtests.bench.bench_cli import main as bench_main
from tests.reliability.served import start_served

METRICS = ("ttft", "tpot", "itl", "e2el")


@pytest.fixture(scope="module")
def server_url(llama_dir: str):
    served = start_served(["--model", llama_dir, "--max-num-seqs", "16"])
    try:
        yield served.url
    finally:
        served.stop()


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_bench_eight_requests_reports_every_metric(server_url, endpoint, tmp_path):
    out = tmp_path / "bench.json"
    rc = bench_main(["--base-url", server_url, "--endpoint-type", endpoint, "--dataset-name", "random",
                     "--num-prompts", "8", "--random-input-len", "24", "--random-output-len", "6", "--ignore-eos",
                     "--seed", "3", "--goodput", "ttft:60000", "tpot:60000", "--json", str(out), "--disable-tqdm"])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["completed"] == 8 and result["failed"] == 0
    assert result["total_output_tokens"] == 8 * 6  # ignore_eos: every request runs to its length
    for name in METRICS:
        for stat in ("mean", "median", "std", "p50", "p90", "p99"):
            assert f"{stat}_{name}_ms" in result, f"{stat}_{name}_ms"
    assert 0 < result["mean_ttft_ms"] <= result["mean_e2el_ms"]
    for key in ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput"):
        assert result[key] > 0, key
    assert result["good_requests"] == 8
