"""`kvserve bench --compare` (a)(b)(c) end to end on the tiny model, the
offline-throughput script, and the pure parts (names, prompts, extrapolation)."""
from __future__ import annotations

import json
import math

import pytest

from kvserve.loadtests.bench.bench_cli import main
from kvserve.loadtests.compare import resolve_baselines
from kvserve.loadtests.compare.compare_extrapolate import ServiceSample, fit_service_model, replay_serial, subset_indices
from kvserve.loadtests.compare.compare_prompts import token_prompts
from kvserve.loadtests.compare.compare_run import CompareOptions
from kvserve.loadtests.bench.datasets import LognormalDataset, SharedPrefixDataset

PER_BASELINE = ("duration", "output_throughput", "total_token_throughput", "request_throughput",
                "p50_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_e2el_ms", "completed", "failed",
                "total_input_tokens", "total_output_tokens", "max_concurrent_requests")


def test_compare_abc_reports_every_metric_and_consistent_ratios(llama_dir, tmp_path, capsys):
    out = tmp_path / "compare.json"
    rc = main(["--compare", "--model", llama_dir, "--compare-baselines", "a,b,c", "--num-prompts", "4",
               "--random-input-len", "8", "--random-range-ratio", "0.5", "--random-output-len", "4",
               "--naive-max-requests", "2", "--static-batch-size", "2", "--json", str(out), "--disable-tqdm"])
    assert rc == 0
    table = capsys.readouterr().out
    for row in ("(a) hf-serial", "(b) hf-static, B=2", "(c) kvserve-offline", "(c)/(a)", "measured: 2 of 4"):
        assert row in table, row
    doc = json.loads(out.read_text())
    prompts = doc["workload"]
    total_out = prompts["total_output_tokens"]  # lengths vary by +-50%: static batches waste some
    assert prompts["num_requests"] == 4 and 8 <= total_out <= 24
    base = doc["baselines"]
    assert set(base) == {"a", "b", "c"}
    for key, b in base.items():
        for metric in PER_BASELINE:
            assert isinstance(b[metric], (int, float)), (key, metric)
        assert (b["completed"], b["failed"]) == (4, 0), key
        assert b["total_output_tokens"] == total_out and b["total_input_tokens"] == prompts["total_input_tokens"]
        assert 0 < b["output_throughput"] < b["total_token_throughput"], key
        assert b["output_throughput"] == pytest.approx(total_out / b["duration"])
        assert 0 < b["p50_ttft_ms"] <= b["p99_ttft_ms"] <= b["p99_e2el_ms"], key
    # Queueing is visible: one at a time, or two batches, the last first token comes later than the median.
    assert base["a"]["p99_ttft_ms"] > base["a"]["p50_ttft_ms"]
    assert base["b"]["p99_ttft_ms"] > base["b"]["p50_ttft_ms"]
    a = base["a"]
    assert a["extrapolated"] and a["measured_requests"] == 2 and a["measured_subset"]["completed"] == 2
    assert a["max_concurrent_requests"] == 1 and base["b"]["max_concurrent_requests"] == 2
    assert 1 <= base["c"]["max_concurrent_requests"] <= 4
    ratios = doc["ratios"]
    assert set(ratios) == {"c_over_a", "c_over_b", "b_over_a"}  # no (d): it did not run
    for name, value in ratios.items():
        num, den = name.split("_over_")
        assert math.isfinite(value) and value > 0
        assert value == pytest.approx(base[num]["output_throughput"] / base[den]["output_throughput"])
    # Same greedy tokens on the requests (a) measured: the baselines did the same work.
    for key in ("b_vs_a", "c_vs_a"):
        agree = doc["greedy_agreement"][key]
        assert agree["requests_compared"] == 2 and agree["identical_requests"] == 2, key


def test_offline_throughput_runs_and_prints_the_ratio(llama_dir, tmp_path, capsys):
    from kvserve.loadtests.compare.offline_throughput import main as offline_main

    out = tmp_path / "offline.json"
    assert offline_main(["--model", llama_dir, "--num-prompts", "4", "--input-len", "8", "--output-len", "4",
                         "--quiet", "--json", str(out)]) == 0
    assert "ratio kvserve / transformers:" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["hf_serial"]["total_output_tokens"] == doc["kvserve_offline"]["total_output_tokens"] == 16
    assert doc["ratio"] == pytest.approx(doc["kvserve_offline_output_throughput"] / doc["hf_serial_output_throughput"])


def test_baseline_names_and_bad_compare_flags(capsys):
    assert resolve_baselines("c,a") == ["a", "c"]
    assert resolve_baselines(["hf-static", "(d)"]) == ["b", "d"]
    assert resolve_baselines("") == ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match="unknown baseline 'e'"):
        resolve_baselines("a,e")
    assert main(["--compare", "--compare-baselines", "x"]) == 2
    assert "unknown baseline" in capsys.readouterr().err
    assert main(["--compare", "--endpoint-type", "chat"]) == 2
    assert "token-id prompts" in capsys.readouterr().err
    assert main(["--compare", "--temperature", "0.7"]) == 2
    assert main(["--compare", "--static-batch-size", "0"]) == 2
    assert main(["--compare", "--cpu-reserved-cores", "-1"]) == 2
    assert "--cpu-reserved-cores must be >= 0" in capsys.readouterr().err


def test_reserved_cores_reach_both_kvserve_baselines():
    # (c) and (d) must run the same engine, or their ratio measures more than the serving path.
    opts = CompareOptions(model_dir="m", cpu_reserved_cores=1)
    assert opts.engine_args()["cpu_reserved_cores"] == 1
    assert opts.serve_flags()[-2:] == ["--cpu-reserved-cores", "1"]
    assert "cpu_reserved_cores" not in CompareOptions(model_dir="m").engine_args()


def test_token_prompts_have_exact_lengths_and_shared_prefixes():
    ds = LognormalDataset(num_prompts=16, input_len=160, range_ratio=0.6, output_median=64, output_max=256, seed=3)
    reqs = token_prompts(ds, vocab_size=2048)
    ins, outs = ds.lengths()
    assert [r.prompt_len for r in reqs] == list(ins) and [r.output_len for r in reqs] == list(outs)
    assert all(64 <= r.prompt_len <= 256 and max(r.prompt_ids) < 2048 for r in reqs)
    assert [r.prompt_ids for r in token_prompts(ds, 2048)] == [r.prompt_ids for r in reqs]  # seeded
    sp = token_prompts(SharedPrefixDataset(2, 3, prefix_len=10, question_len=4, output_len=5, seed=0), 100)
    assert len(sp) == 6 and all(r.prompt_len == 14 for r in sp)
    for p in (0, 1):
        group = [r.prompt_ids for r in sp if r.prefix_id == p]
        assert len(group) == 3 and len({tuple(g[:10]) for g in group}) == 1 and len({tuple(g) for g in group}) == 3


def test_serial_extrapolation_recovers_the_service_model():
    # Synthetic subset: prefill 5 ms + 0.1 ms/token, decode 2 ms/token, 1 ms overhead.
    samples = [ServiceSample(L, n, 0.005 + 0.0001 * L, 0.002 * (n - 1), 0.001) for L, n in
               ((50, 10), (100, 30), (200, 5), (80, 60))]
    fit = fit_service_model(samples)
    assert fit.prefill_fixed_s == pytest.approx(0.005) and fit.prefill_per_token_s == pytest.approx(0.0001)
    assert fit.decode_per_token_s == pytest.approx(0.002) and fit.overhead_s == pytest.approx(0.001)
    reqs = token_prompts(LognormalDataset(num_prompts=8, input_len=100, range_ratio=0.5, seed=1), 64)
    records, duration = replay_serial(reqs, fit)
    assert duration == pytest.approx(sum(fit.service(r.prompt_len, r.output_len) for r in reqs))
    ttfts = [r.ttft for r in records]
    assert ttfts == sorted(ttfts) and records[-1].e2el == pytest.approx(duration)
    assert [r.output_tokens for r in records] == [r.output_len for r in reqs]
    assert subset_indices(64, 16)[:3] == [0, 4, 8] and len(subset_indices(64, 16)) == 16
    assert subset_indices(5, 0) == subset_indices(5, 9) == [0, 1, 2, 3, 4]


def test_relabel_keeps_the_workload_shape_and_shares_no_block_across_rounds():
    from kvserve.loadtests.compare.compare_prompts import relabel, token_prompts
    from kvserve.loadtests.bench.datasets import SharedPrefixDataset

    ds = SharedPrefixDataset(num_prefixes=2, questions_per_prefix=3, prefix_len=32, question_len=8, output_len=4)
    base = token_prompts(ds, 500)
    assert relabel(base, 0, 500) == base
    rounds = [relabel(base, i, 500) for i in (1, 2)]
    for other in rounds:
        assert [(r.prompt_len, r.output_len, r.prefix_id) for r in other] == \
            [(r.prompt_len, r.output_len, r.prefix_id) for r in base]
        same_prefix = [r for r in other if r.prefix_id == 0]
        assert all(r.prompt_ids[:32] == same_prefix[0].prompt_ids[:32] for r in same_prefix)
        assert all(0 <= t < 500 for r in other for t in r.prompt_ids)
    blocks = [{tuple(r.prompt_ids[k:k + 16]) for r in rs for k in range(0, r.prompt_len - 15, 16)}
              for rs in (base, *rounds)]
    assert not (blocks[0] & blocks[1]) and not (blocks[0] & blocks[2]) and not (blocks[1] & blocks[2])
