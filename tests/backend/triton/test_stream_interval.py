"""--stream-interval (KVSERVE_STREAM_INTERVAL): streamed responses carry up to N
new tokens each; the first token and the last are never held back, and the
tokens and text are exactly those of an interval of 1."""
from __future__ import annotations

import pytest

from kvserve.backend import LLM, SamplingParams
from tests.conftest import tiny_model
from tests.backend.triton.test_llm_model import MAX_MODEL_LEN, _inputs, _stream
from tests.utils.processes import run_host

INTERVAL = 4


@pytest.fixture(scope="module")
def host():
    env = {"KVSERVE_MODEL": tiny_model("llama"), "KVSERVE_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
           "KVSERVE_NUM_KV_BLOCKS": "256", "KVSERVE_STREAM_INTERVAL": str(INTERVAL)}
    with run_host(env) as h:
        yield h


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 13])
def test_tokens_arrive_in_groups_of_the_interval(host, max_tokens):
    params = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    chunks, finals, error = _stream(host.grpc_url, _inputs("Once upon a time", params))
    assert error is None and finals == 1
    sizes = [len(ids) for _, ids, _ in chunks]
    # First token alone (time to first token is not traded away), then full groups, then the rest.
    assert sizes[0] == 1 and all(s == INTERVAL for s in sizes[1:-1]) and 1 <= sizes[-1] <= INTERVAL
    assert sum(sizes) == max_tokens and chunks[-1][2] == "length"
    offline = LLM(model=tiny_model("llama"), max_model_len=MAX_MODEL_LEN).generate(
        "Once upon a time", SamplingParams(**params))[0].outputs[0]
    assert "".join(text for text, _, _ in chunks) == offline.text
    assert [t for _, ids, _ in chunks for t in ids] == offline.token_ids


def test_a_stop_string_flushes_what_was_held(host):
    offline = LLM(model=tiny_model("llama"), max_model_len=MAX_MODEL_LEN).generate(
        "Once upon a time", SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0].outputs[0]
    stop = offline.text[len(offline.text) // 2:][:3]
    if not stop.strip():
        pytest.skip("the tiny model's greedy text has no usable stop string here")
    params = {"max_tokens": 24, "temperature": 0, "ignore_eos": True, "stop": [stop]}
    chunks, finals, error = _stream(host.grpc_url, _inputs("Once upon a time", params))
    assert error is None and finals == 1 and chunks[-1][2] == "stop"
    assert "".join(text for text, _, _ in chunks) == offline.text[:offline.text.index(stop)]
