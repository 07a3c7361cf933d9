"""Streaming text integrity with multi-byte characters (é, 世, 界, 🙂), on the
cycle model whose greedy output is known exactly and spells every character
one byte token at a time (see cycle_model.py).

Every SSE frame is valid UTF-8 (and JSON) on its own; no U+FFFD appears; the
deltas joined equal the non-streamed text and the expected text; a stop string
is never partly emitted, even when its first characters were already generated.
"""
from __future__ import annotations

import asyncio

import pytest

from tests.reliability.cycle_model import CYCLE_TEXT, expected_text
from tests.reliability.served import Served
from tests.reliability.sse_client import StreamResult, new_session, stream

CYCLE_BYTES = len(CYCLE_TEXT.encode("utf-8"))  # one token per byte
CHAT = [{"role": "user", "content": "Say something"}]


def run_stream(served: Served, path: str, body: dict) -> StreamResult:
    async def go() -> StreamResult:
        async with new_session() as session:
            return await stream(session, served, path, body)
    return asyncio.run(asyncio.wait_for(go(), 60))


def check_frames(res: StreamResult) -> None:
    assert res.status == 200 and res.done and res.error is None, (res.status, res.body[:200])
    for frame in res.frames:
        frame.decode("utf-8")  # strict: raises on a broken sequence
    assert all("\ufffd" not in d for d in res.deltas()), res.deltas()


def both(served: Served, chat: bool, **params) -> tuple[str, StreamResult, dict]:
    """(non-streamed text, streamed result, non-streamed choice) of one greedy request."""
    body = {"model": "cycle", "temperature": 0, "ignore_eos": True, **params}
    if chat:
        body["messages"] = CHAT
        whole = served.post("/v1/chat/completions", body).json()["choices"][0]
        text = whole["message"]["content"]
        res = run_stream(served, "/v1/chat/completions", body)
    else:
        body["prompt"] = "Hello"
        whole = served.post("/v1/completions", body).json()["choices"][0]
        text = whole["text"]
        res = run_stream(served, "/v1/completions", body)
    return text, res, whole


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_multibyte_stream_equals_whole_text(cycle_server: Served, chat: bool) -> None:
    max_tokens = 3 * CYCLE_BYTES
    text, res, whole = both(cycle_server, chat, max_tokens=max_tokens)
    check_frames(res)
    assert text == res.text == CYCLE_TEXT * 3 == expected_text(max_tokens)
    assert whole["finish_reason"] == "length" and res.finish_reasons == ["length"]
    # The characters travel as raw UTF-8 (not \\u escapes), split over many frames.
    wire = b"".join(res.frames)
    assert "🙂".encode() in wire and "世".encode() in wire
    assert len([d for d in res.deltas() if d]) >= 3 * len(CYCLE_TEXT) // 2


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("stop, include, expected", [
    (["界🙂"], False, "aé 世"),  # 界 was generated before the stop string was complete: never sent
    (["界🙂"], True, "aé 世界🙂"),
    (["世x", "界🙂b"], False, "aé 世"),  # two candidates held back in turn
    (["🙂c"], False, CYCLE_TEXT * 2),  # a prefix that never completes is released, whole
    (["b"], False, "aé 世界🙂"),
])
def test_stop_strings_are_never_partly_emitted(cycle_server: Served, chat: bool, stop: list[str], include: bool,
                                               expected: str) -> None:
    params = {"max_tokens": 2 * CYCLE_BYTES, "stop": stop, "include_stop_str_in_output": include}
    text, res, whole = both(cycle_server, chat, **params)
    check_frames(res)
    assert text == res.text == expected
    finish = "length" if expected == CYCLE_TEXT * 2 else "stop"
    assert whole["finish_reason"] == finish and res.finish_reasons == [finish]


def test_cut_inside_a_character_is_consistent(cycle_server: Served) -> None:
    """max_tokens ending inside a character: whatever the server decides to show for
    the dangling byte, the stream and the whole response agree, and every frame is
    still valid UTF-8."""
    for max_tokens in (2, 5, 9):
        text, res, _ = both(cycle_server, False, max_tokens=max_tokens)
        assert res.status == 200 and res.done
        for frame in res.frames:
            frame.decode("utf-8")
        assert res.text == text
        assert text.startswith(expected_text(max_tokens).rstrip("\ufffd"))


def test_n2_streams_keep_characters_whole(cycle_server: Served) -> None:
    res = run_stream(cycle_server, "/v1/completions", {"model": "cycle", "prompt": "Hello", "n": 2, "temperature": 0,
                                                       "ignore_eos": True, "max_tokens": CYCLE_BYTES})
    check_frames(res)
    by_choice: dict[int, str] = {0: "", 1: ""}
    for event in res.events():
        for c in event["choices"]:
            by_choice[c["index"]] += c["text"]
    assert by_choice == {0: CYCLE_TEXT, 1: CYCLE_TEXT}
