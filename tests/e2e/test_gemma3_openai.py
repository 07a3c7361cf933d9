"""`kvserve serve --model gemma-3-270m` (the known name: fetched, assembled and checked) answers the
official openai client: a completion that says Paris, streamed equal to unstreamed past the sliding
window, multi-byte text with no U+FFFD, and a chat request refused by name (a base model has no
chat template)."""
from __future__ import annotations

import pytest

from tests.serve_process import kvserve_serve

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m"


@pytest.fixture(scope="module")
def client(gemma3_model_path: str):
    # gemma3_model_path: fetched first, so the server's own fetch is a cache hit inside its start-up time.
    args = ["--model", MODEL, "--port", "0", "--max-num-seqs", "8", "--max-model-len", "4096",
            "--log-format", "console"]
    with kvserve_serve(args, timeout_s=420) as (_, line):
        assert f"model={MODEL}" in line, line
        yield openai.OpenAI(base_url=f"{line.split()[3]}/v1", api_key="unused", max_retries=0, timeout=300)


def _complete(client, prompt: str, **kw):
    return client.completions.create(model=MODEL, prompt=prompt, temperature=0, **kw)


def test_the_capital_of_france(client) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    text = _complete(client, "The capital of France is", max_tokens=24).choices[0].text
    assert "Paris" in text or "capital of the country of France" in text, text


def test_streamed_equals_unstreamed_past_the_window(client) -> None:
    """600 tokens out: the sliding layers' 512-token window slides during decode."""
    kw = dict(max_tokens=600, extra_body={"ignore_eos": True})
    whole = _complete(client, "Once upon a time, in a small village,", **kw)
    assert whole.usage.completion_tokens == 600
    parts = [c.choices[0].text for c in _complete(client, "Once upon a time, in a small village,", stream=True, **kw)
             if c.choices]
    assert "".join(parts) == whole.choices[0].text


def test_multi_byte_text_has_no_replacement_character(client) -> None:
    for prompt in ("東京は日本の首都です。東京の", "Emoji: 🎉🍕🚀 and more emoji:"):
        text = _complete(client, prompt, max_tokens=48).choices[0].text
        assert text and "\ufffd" not in text
        streamed = "".join(c.choices[0].text for c in _complete(client, prompt, max_tokens=48, stream=True) if c.choices)
        assert streamed == text and "\ufffd" not in streamed


def test_chat_is_refused_by_name(client) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert "--chat-template" in str(err.value) and err.value.code == "chat_template_missing"
