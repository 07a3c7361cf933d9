"""`kvserve serve` with no --model serves the real default (SmolLM2-135M-Instruct, fetched into the
cache), and the official openai client gets real text from it: the answers, stop strings the model
really produces, seeded sampling, long streamed answers and multi-byte characters."""
from __future__ import annotations

import pytest

from tests.serve_process import kvserve_serve

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(real_model_path: str):
    # real_model_path: fetched first, so the server's own fetch is a cache hit inside its start-up time.
    with kvserve_serve(["--port", "0", "--max-num-seqs", "16", "--log-format", "console"], timeout_s=300) as (_, line):
        assert f"model={MODEL}" in line, line
        yield openai.OpenAI(base_url=f"{line.split()[3]}/v1", api_key="unused", max_retries=0, timeout=120)


def _chat(client, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, **kw)


def test_default_model_is_listed_and_answers_paris(client) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    out = _chat(client, FRANCE, temperature=0, max_tokens=32)
    assert "Paris" in out.choices[0].message.content
    assert out.choices[0].finish_reason == "stop"  # the model's own end token, not the length limit


def test_a_stop_string_the_model_produces_cuts_the_text_there(client) -> None:
    full = _chat(client, FRANCE, temperature=0, max_tokens=32).choices[0].message.content
    cut = _chat(client, FRANCE, temperature=0, max_tokens=32, stop=["Paris"]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.message.content == full[:full.index("Paris")]
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       _chat(client, FRANCE, temperature=0, max_tokens=32, stop=["Paris"], stream=True))
    assert streamed == cut.message.content


def test_n2_with_a_seed_gives_two_different_real_sentences_again_and_again(client) -> None:
    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    first = _chat(client, messages, n=2, temperature=1.0, seed=1234, max_tokens=40)
    again = _chat(client, messages, n=2, temperature=1.0, seed=1234, max_tokens=40)
    texts = [c.message.content for c in first.choices]
    assert texts == [c.message.content for c in again.choices]  # seeded: reproducible
    assert texts[0] != texts[1] and all(len(t.split()) >= 4 for t in texts)


def test_streamed_equals_non_streamed_on_a_long_answer(client) -> None:
    messages = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]
    kw = dict(temperature=0, max_tokens=200, extra_body={"ignore_eos": True})
    whole = _chat(client, messages, **kw)
    assert whole.usage.completion_tokens == 200
    parts = [c.choices[0].delta.content or "" for c in _chat(client, messages, stream=True, **kw) if c.choices]
    assert "".join(parts) == whole.choices[0].message.content


def test_multi_byte_output_has_no_replacement_characters(client) -> None:
    messages = [{"role": "user", "content": "Write the French words for 'summer', 'Christmas' and 'coffee'."}]
    whole = _chat(client, messages, temperature=0, max_tokens=48).choices[0].message.content
    assert any(ord(ch) > 127 for ch in whole), whole  # accented letters came out
    assert "\ufffd" not in whole
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       _chat(client, messages, temperature=0, max_tokens=48, stream=True) if c.choices)
    assert streamed == whole
