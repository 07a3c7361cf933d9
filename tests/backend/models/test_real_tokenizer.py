"""The real default model's tokenizer and chat template, read from its GGUF metadata, against
transformers reading the same file; and the incremental detokenizer over its real BPE merges."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.backend.engine.detokenizer import IncrementalDetokenizer
from kvserve.backend.engine.engine_tokenizer import load_engine_tokenizer
from kvserve.frontend.openai.chat_template import render_chat
from kvserve.seam.tokenizer import ModelTokenizer

TEXTS = [
    "What is the capital of France?", "  leading spaces\tand tabs\n\nand blank lines  ",
    "Numbers 12345 and 3.14159, dates 2026-12-01", "Café, crème brûlée, Noël, été, naïve",
    "Emoji 😀🚀🇫🇷 and CJK 你好世界, Привет мир", "code: def f(x):\n    return x**2  # square",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
]
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about paging."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Name a colour."}],
]


@pytest.fixture(scope="module")
def ours(real_model_path: str) -> ModelTokenizer:
    return load_engine_tokenizer(real_model_path)


@pytest.fixture(scope="module")
def theirs(real_model_path: str):
    from transformers import AutoTokenizer
    path = Path(real_model_path)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def gateway(real_model_path: str, tmp_path_factory: pytest.TempPathFactory):
    from kvserve.backend.models.gguf_tokenizer import gateway_files_dir
    return ModelTokenizer.from_folder(gateway_files_dir(real_model_path, tmp_path_factory.mktemp("meta")))


@pytest.mark.parametrize("text", TEXTS)
def test_engine_and_gateway_encode_as_transformers(ours, theirs, gateway, text: str) -> None:
    expected = theirs(text, add_special_tokens=False)["input_ids"]
    assert ours.encode(text, add_special_tokens=False) == expected
    assert gateway.encode(text, add_special_tokens=False) == expected
    assert ours.decode(expected, skip_special_tokens=False) == text


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_round_trip(theirs, gateway, ours, messages) -> None:
    rendered = render_chat(gateway.chat_template, messages, bos_token=gateway.bos_token,
                           eos_token=gateway.eos_token)
    assert rendered == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n")
    ids = ours.encode(rendered, add_special_tokens=False)
    assert ours.decode(ids, skip_special_tokens=False) == rendered
    assert ids.count(1) == rendered.count("<|im_start|>")  # special tokens are single ids, not spelled out


@pytest.mark.parametrize("text", TEXTS[3:5])
def test_incremental_detokenizer_over_real_merges(ours, text: str) -> None:
    ids = ours.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(ours, [], [], False, True)
    deltas = [detok.add_tokens([t], finished=i == len(ids) - 1).text_delta for i, t in enumerate(ids)]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    if "😀" in text:  # these emoji span several byte-level tokens: their first tokens waited for the rest
        assert any(d == "" for d in deltas)


def test_end_of_turn_is_the_stop_token(ours) -> None:
    assert ours.eos_token_ids == {2} and ours.id_to_token(2) == "<|im_end|>"


@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_join_to_the_text(ours, text: str) -> None:
    # chat logprobs' `bytes`: byte-level BPE spells each byte as one character; a token holding
    # part of an emoji reads as U+FFFD alone, but its bytes are its own
    ids = ours.encode(text, add_special_tokens=False)
    assert b"".join(ours.token_bytes(i) for i in ids).decode("utf-8") == text
