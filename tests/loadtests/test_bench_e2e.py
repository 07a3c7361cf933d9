"""`kvserve bench` end to end against the fake SSE server."""
from __future__ import annotations

import json
from pathlib import Path

from kvserve.loadtests.bench.bench_cli import main

from fake_openai_server import CHAT_OVERHEAD, MODEL, count_body

LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "std", "p50", "p90", "p99")
TOP_LEVEL = (
    "completed", "failed", "total_input_tokens", "total_output_tokens", "duration",
    "request_throughput", "request_goodput", "good_requests", "output_throughput",
    "total_token_throughput", "max_concurrent_requests", "peak_output_throughput",
    "errors", "config", "dataset", "goodput_slos_ms",
)


def _bench(server, tmp_path: Path, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "result.json"
    rc = main(["--base-url", server.url, "--json", str(out), "--disable-tqdm", *extra])
    return rc, (json.loads(out.read_text()) if out.exists() else {})


def test_bench_json_has_every_metric_with_sane_values(fake_server, tmp_path):
    server = fake_server(delay_s=0.004)
    rc, doc = _bench(server, tmp_path, "--num-prompts", "8", "--random-input-len", "40",
                     "--random-output-len", "12", "--ignore-eos", "--save-detailed",
                     "--goodput", "ttft:5000", "tpot:5000")
    assert rc == 0
    for key in TOP_LEVEL:
        assert key in doc, key
    for name in LATENCIES:
        for stat in STATS:
            assert isinstance(doc[f"{stat}_{name}_ms"], float), f"{stat}_{name}_ms"
    assert (doc["completed"], doc["failed"]) == (8, 0)
    assert doc["total_output_tokens"] == 8 * 12  # what the fake streamed, via usage
    assert doc["total_input_tokens"] == 8 * 40  # exact lengths through /tokenize
    assert doc["dataset"]["exact_prompt_lengths"] is True
    assert 0 < doc["mean_ttft_ms"] < doc["mean_e2el_ms"]
    assert doc["p99_e2el_ms"] >= doc["median_e2el_ms"] >= doc["mean_ttft_ms"]
    assert doc["mean_itl_ms"] >= 0.8 * 4.0  # the fake sleeps 4 ms between chunks
    assert abs(doc["request_throughput"] * doc["duration"] - 8) < 1e-6
    assert abs(doc["request_goodput"] - doc["request_throughput"]) < 1e-9  # loose SLOs: all good
    assert doc["config"]["model"] == MODEL and "api_key" not in doc["config"]
    assert doc["config"]["request_rate"] == "inf"
    for r in doc["requests"]:
        assert r["success"] and 0 < r["ttft_ms"] < r["e2el_ms"]
        assert r["output_tokens"] == 12 and len(r["itl_ms"]) == 11
        # TPOT exactly as vLLM defines it
        assert abs(r["tpot_ms"] - (r["e2el_ms"] - r["ttft_ms"]) / 11) < 1e-6
    for body in server.bodies:
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["ignore_eos"] is True and body["model"] == MODEL and body["max_tokens"] == 12
        assert count_body(body) == 40


def test_failures_are_counted_not_fatal(fake_server, tmp_path):
    server = fake_server(fail_every=4)
    rc, doc = _bench(server, tmp_path, "--num-prompts", "8", "--random-input-len", "16",
                     "--random-output-len", "4")
    assert rc == 0
    assert (doc["completed"], doc["failed"]) == (6, 2)
    assert doc["total_output_tokens"] == 6 * 4
    assert sum(doc["errors"].values()) == 2
    assert all(msg.startswith("HTTP 500") for msg in doc["errors"])


def test_mid_stream_error_counts_as_failure(fake_server, tmp_path):
    server = fake_server(stream_error_every=3)
    rc, doc = _bench(server, tmp_path, "--num-prompts", "6", "--random-input-len", "16",
                     "--random-output-len", "6")
    assert rc == 0 and (doc["completed"], doc["failed"]) == (4, 2)
    assert all("injected stream error" in msg for msg in doc["errors"])


def test_all_failed_exits_1(fake_server, tmp_path):
    server = fake_server(fail_every=1)
    rc, doc = _bench(server, tmp_path, "--num-prompts", "3", "--random-input-len", "8",
                     "--random-output-len", "2")
    assert rc == 1 and doc["completed"] == 0 and doc["failed"] == 3
    assert doc["mean_ttft_ms"] == 0.0  # empty series report 0, never NaN


def test_chat_endpoint_concurrency_cap_and_template_tokens(fake_server, tmp_path):
    server = fake_server()
    rc, doc = _bench(server, tmp_path, "--endpoint-type", "chat", "--num-prompts", "6",
                     "--random-input-len", "30", "--random-output-len", "5", "--max-concurrency", "2",
                     "--api-key", "sk-test")
    assert rc == 0 and doc["completed"] == 6
    assert doc["max_concurrent_requests"] == 2
    assert server.auth == ["Bearer sk-test"] * 6
    assert "sk-test" not in json.dumps(doc) and doc["config"]["api_key_set"] is True
    assert doc["total_output_tokens"] == 6 * 5
    assert doc["total_input_tokens"] == 6 * 30  # counted with the chat overhead included
    assert all("messages" in b and b["max_completion_tokens"] == 5 for b in server.bodies)
    assert all(count_body(b) == 30 and count_body(b) > CHAT_OVERHEAD for b in server.bodies)
    # The role-only first chunk must not count: TTFT includes the fake's 20 ms prefill.
    assert doc["median_ttft_ms"] >= 15.0


def test_without_tokenize_or_usage_falls_back(fake_server, tmp_path):
    server = fake_server(tokenize=False, usage=False)
    rc, doc = _bench(server, tmp_path, "--num-prompts", "4", "--random-input-len", "20",
                     "--random-output-len", "7", "--model", MODEL)
    assert rc == 0
    assert doc["dataset"]["exact_prompt_lengths"] is False
    assert doc["usage_reported"] is False
    assert doc["total_output_tokens"] == 4 * 7  # one token per content chunk
    assert doc["total_input_tokens"] == 4 * 20  # the word-count estimate


def test_plot_is_written(fake_server, tmp_path):
    server = fake_server()
    png = tmp_path / "plot.png"
    rc, _ = _bench(server, tmp_path, "--num-prompts", "4", "--random-input-len", "8",
                   "--random-output-len", "6", "--request-rate", "50", "--plot", str(png))
    assert rc == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_compare_rejects_an_unknown_baseline_before_any_work(capsys):
    assert main(["--compare", "--compare-baselines", "nonsense"]) == 2
    assert "unknown baseline" in capsys.readouterr().err


def test_bad_arguments_fail_before_any_traffic(capsys):
    assert main(["--goodput", "latency:5"]) == 2
    assert "--goodput" in capsys.readouterr().err
    assert main(["--dataset-name", "shared-prefix", "--num-prompts", "7"]) == 2
    assert "prefixes x questions" in capsys.readouterr().err
    assert main(["--burstiness", "0"]) == 2


def test_unreachable_server_is_a_clean_error(capsys):
    assert main(["--base-url", "http://127.0.0.1:9", "--num-prompts", "1", "--disable-tqdm"]) == 1
    assert "cannot benchmark" in capsys.readouterr().err
