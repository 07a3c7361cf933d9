"""Static batching baseline (b): left padding, waste accounting, batch-level TTFT."""
from __future__ import annotations

import pytest

from kvserve.loadtests.compare import baseline_hf
from kvserve.loadtests.compare.compare_prompts import CompareRequest


@pytest.fixture(scope="module")
def hf_model(llama_dir):
    model = baseline_hf.load_hf_model(llama_dir, "float32", "cpu")
    baseline_hf.warm_up(model)
    return model


def _requests() -> list[CompareRequest]:
    shapes = ((5, 2), (9, 4), (7, 3), (6, 1))  # (prompt tokens, output tokens)
    return [CompareRequest(i, [(17 * i + 3 * k) % 500 + 1 for k in range(L)], n) for i, (L, n) in enumerate(shapes)]


def test_static_batches_pad_and_count_only_real_output_tokens(hf_model):
    reqs = _requests()
    run = baseline_hf.run_static(hf_model, reqs, batch_size=2)
    # batch 1: prompts 5, 9 -> 4 pad; outputs 2, 4 -> runs 4 steps, 2 wasted.
    # batch 2: prompts 7, 6 -> 1 pad; outputs 3, 1 -> runs 3 steps, 2 wasted.
    assert run.extra["padded_prompt_tokens"] == 5
    assert run.extra["wasted_output_tokens"] == 4
    assert run.extra["generated_tokens_incl_waste"] == 2 * 4 + 2 * 3
    assert [r.output_tokens for r in run.records] == [2, 4, 3, 1]
    assert sum(r.output_tokens for r in run.records) == 10
    assert {i: len(ids) for i, ids in run.token_ids.items()} == {0: 2, 1: 4, 2: 3, 3: 1}
    first, second = run.records[:2], run.records[2:]
    # One prefill per batch: its members share their first-token time; the second batch waits for the first.
    assert first[0].ttft == first[1].ttft and second[0].ttft == second[1].ttft
    assert second[0].ttft > first[0].e2el == first[1].e2el
    assert all(r.start == 0.0 for r in run.records)


def test_left_padding_gives_the_tokens_of_unpadded_runs(hf_model):
    reqs = _requests()
    static = baseline_hf.run_static(hf_model, reqs, batch_size=4)
    serial = baseline_hf.run_serial(hf_model, reqs, max_requests=0)
    assert not serial.extrapolated and serial.measured_requests == 4
    # With a wrong mask or right padding the shorter prompts would continue differently.
    assert static.token_ids == serial.token_ids
    ttfts = [r.ttft for r in serial.records]
    assert ttfts == sorted(ttfts) and ttfts[0] < serial.records[0].e2el <= ttfts[1]
