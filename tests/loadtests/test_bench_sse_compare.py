"""SSE parsing edge cases and the offline-compare seam."""
from __future__ import annotations

import time

import pytest

from kvserve.loadtests.bench.bench_request import BenchRequest
from kvserve.loadtests.compare import (
    GenerationOutput, build_requests, format_comparison, resolve_baselines, run_comparison,
)
from kvserve.loadtests.bench.datasets import RandomDataset
from kvserve.loadtests.bench.sse import LineSplitter, data_payload, parse_payload


def test_line_splitter_reassembles_across_chunk_boundaries():
    s = LineSplitter()
    assert s.feed(b'data: {"choices": [{"te') == []
    assert s.feed(b'xt": "a"}]}\r\n\r\ndata: [DO') == ['data: {"choices": [{"text": "a"}]}', ""]
    assert s.feed(b"NE]\n") == ["data: [DONE]"]
    assert s.flush() == []


def test_payload_kinds():
    assert parse_payload('{"choices":[{"text":"hi"}]}').text == "hi"
    assert parse_payload('{"choices":[{"delta":{"role":"assistant","content":""}}]}').text == ""
    assert parse_payload('{"choices":[{"delta":{"reasoning_content":"hm"}}]}').text == "hm"
    usage = parse_payload('{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}')
    assert (usage.prompt_tokens, usage.completion_tokens, usage.text) == (3, 7, "")
    assert parse_payload("[DONE]").done
    assert "overloaded" in parse_payload('{"error":{"message":"overloaded"}}').error
    assert parse_payload("{not json").error
    assert data_payload(": keep-alive") is None and data_payload("event: x") is None
    assert data_payload("data:[DONE]") == "[DONE]"


def _requests(n: int) -> list[BenchRequest]:
    return [BenchRequest(i, f"prompt {i}", 2, 8) for i in range(n)]


def test_compare_seam_runs_baselines_on_the_same_prompts():
    seen: dict[str, list[str]] = {}

    def make(label: str, per_call_s: float, batch: int):
        def generate(reqs):
            seen[label] = [r.prompt for r in reqs]
            out = []
            for start in range(0, len(reqs), batch):
                time.sleep(per_call_s)
                out += [GenerationOutput(r.index, r.expected_output_len) for r in reqs[start:start + batch]]
            return out
        return generate

    reqs = _requests(6)
    results = run_comparison(reqs, {"serial": make("serial", 0.01, 1), "batched": make("batched", 0.01, 6)})
    assert seen["serial"] == seen["batched"] == [r.prompt for r in reqs]
    serial, batched = results
    assert serial.total_output_tokens == batched.total_output_tokens == 48
    assert batched.output_throughput > 3 * serial.output_throughput
    table = format_comparison(results, reference="serial")
    assert "vs serial" in table and "1.00x" in table


def test_compare_seam_rejects_missing_outputs_and_resolves_baselines():
    with pytest.raises(ValueError, match="one output per request"):
        run_comparison(_requests(3), {"bad": lambda reqs: [GenerationOutput(0, 1)]})
    assert resolve_baselines([]) == ["a", "b", "c", "d"]
    assert resolve_baselines("d,a") == ["a", "d"]
    with pytest.raises(ValueError, match="unknown baseline"):
        resolve_baselines("zz")


def test_offline_prompt_list_matches_dataset_without_a_server():
    class Counter:
        async def count(self, text: str) -> int:
            return 1 + len(text.split())

    ds = RandomDataset(num_prompts=5, input_len=30, output_len=7, range_ratio=0.3, seed=9)
    a, b = build_requests(ds, Counter()), build_requests(ds, Counter())
    assert [r.prompt for r in a] == [r.prompt for r in b]  # same seed, same prompts
    assert [r.prompt_len for r in a] == list(ds.lengths()[0]) and all(r.exact_len for r in a)
    assert [1 + len(r.prompt.split()) for r in a] == [r.prompt_len for r in a]
    assert [r.expected_output_len for r in a] == list(ds.lengths()[1])
    assert not build_requests(ds)[0].exact_len
