"""Incremental detokenizer: UTF-8 safety, stop strings across tokens, hold-back."""
from __future__ import annotations

import pytest

from kvserve.backend.engine.detokenizer import IncrementalDetokenizer
from kvserve.backend.engine.engine_tokenizer import load_engine_tokenizer


@pytest.fixture(scope="module")
def tok(llama_dir):
    return load_engine_tokenizer(llama_dir)


def _stream(tok, text, stop=(), include=False):
    ids = tok.encode(text)
    d = IncrementalDetokenizer(tok, [], list(stop), include, True)
    deltas = []
    for i, t in enumerate(ids):
        r = d.add_tokens([t], finished=i == len(ids) - 1)
        deltas.append(r.text_delta)
        if r.stop_string:
            return deltas, r.stop_string
    return deltas, None


@pytest.mark.parametrize("text", ["Hello world, how are you?", "Emoji 😀🚀 and CJK 你好世界 mixed", "Привет, мир!"])
def test_deltas_join_to_the_full_decode_and_never_split_a_character(tok, text):
    deltas, _ = _stream(tok, text)
    assert "".join(deltas) == tok.decode(tok.encode(text))
    assert all("\ufffd" not in d for d in deltas)


def test_multibyte_character_split_over_tokens_waits(tok):
    ids = tok.encode("😀")
    assert len(ids) > 1  # byte-level BPE splits the emoji in this small vocabulary
    d = IncrementalDetokenizer(tok, [], [], False, True)
    assert [d.add_tokens([t]).text_delta for t in ids[:-1]] == [""] * (len(ids) - 1)
    assert d.add_tokens([ids[-1]]).text_delta == "😀"


def test_stop_string_spanning_tokens_is_cut_and_never_emitted(tok):
    deltas, stop = _stream(tok, "The capital of France is Paris. The end", stop=["Paris."])
    assert stop == "Paris."
    assert "".join(deltas) == "The capital of France is "
    assert not any("P" in d for d in deltas)


def test_include_stop_str_in_output(tok):
    deltas, stop = _stream(tok, "one two three four", stop=["three"], include=True)
    assert stop == "three" and "".join(deltas) == "one two three"


def test_partial_stop_prefix_is_released_when_it_cannot_match(tok):
    deltas, stop = _stream(tok, "a Pari b Paris", stop=["Paris"])
    assert stop == "Paris" and "".join(deltas) == "a Pari b "


def test_stop_strings_are_not_checked_while_told_not_to(tok):
    # Before min_tokens (the engine's call): a stop string stays in the text; later ones still stop.
    ids = tok.encode("one two one two")
    d = IncrementalDetokenizer(tok, [], ["two"], False, True)
    text, stopped = "", None
    for i, t in enumerate(ids):
        r = d.add_tokens([t], check_stop=i >= len(ids) // 2)
        text += r.text_delta
        if r.stop_string:
            stopped = r.stop_string
            break
    assert stopped == "two" and text == "one two one "


def test_a_stop_string_before_min_tokens_is_not_found_later_beside_a_longer_one(tok):
    # The search must not look back into text that was not to be checked (the window of the
    # longest stop string reached back to the short one's earlier occurrence).
    ids = tok.encode("one two three four five six seven", add_special_tokens=False)
    for stops in (["two"], ["two", "a much longer stop string"]):
        d = IncrementalDetokenizer(tok, [], stops, False, True)
        text = ""
        for n, t in enumerate(ids, start=1):
            r = d.add_tokens([t], check_stop=n >= 8)  # "two" was complete by token 4
            text += r.text_delta
            assert r.stop_string is None, (stops, n)
        assert text + d.add_tokens([], finished=True).text_delta == "one two three four five six seven"


def test_a_long_run_that_never_decodes_cleanly_keeps_the_text_around_it(tok):
    # Skipped special tokens, then lone bytes (0xA1 is never valid UTF-8 alone), then text with
    # a multi-byte character: the window gives up waiting after a few tokens, yet nothing
    # before or after the run is lost or broken.
    d = IncrementalDetokenizer(tok, tok.encode("Say"), [], False, True)
    out = d.add_tokens(tok.encode(" hi")).text_delta
    out += "".join(d.add_tokens([1]).text_delta for _ in range(100))
    lone = "".join(d.add_tokens([97]).text_delta for _ in range(100))
    tail = "".join(d.add_tokens([t]).text_delta for t in tok.encode(" 😀 end"))
    assert out == " hi"
    assert set(lone) == {"\ufffd"} and len(lone) >= 90
    assert tail.endswith("😀 end") and set(tail[:-len("😀 end")]) <= {"\ufffd", " "}


def test_many_long_stop_strings_still_find_the_first_match(tok):
    stops = [chr(0x100 + i) * 256 for i in range(63)] + ["three four"]
    deltas, stop = _stream(tok, "one two three four five", stop=stops)
    assert stop == "three four" and "".join(deltas) == "one two "
    # The first to appear wins; of those completed by one token, the one that starts first.
    deltas, stop = _stream(tok, "one two three four five", stop=["four five", "two thr", "one two three four"])
    assert stop == "two thr" and "".join(deltas) == "one "
    deltas, stop = _stream(tok, "one two three four five", stop=["e f", "three f"])
    assert stop == "three f" and "".join(deltas) == "one two "
