"""The soak's checks on Responses and Messages answers pass what the APIs allow and fail the rest."""
from __future__ import annotations

import random

from kvserve.loadtests.bench.sustained.soak_apis import (EventStream, ResponseChains, api_request,
                                                         check_message, check_message_stream, check_response,
                                                         check_response_stream)


def _response(text: str, out: int, limit: int) -> dict:
    cut = out == limit
    return {"id": "resp_1", "object": "response", "status": "incomplete" if cut else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "output": [{"type": "message", "id": "msg_1", "content": [{"type": "output_text", "text": text}]}],
            "usage": {"input_tokens": 5, "output_tokens": out, "total_tokens": 5 + out}}


def _response_events(deltas: list[str], final: dict) -> list[tuple[str, dict]]:
    item = {"id": "msg_1", "type": "message"}
    names = [("response.created", {}), ("response.in_progress", {}), ("response.output_item.added", {"item": item}),
             *[("response.output_text.delta", {"item_id": "msg_1", "delta": d}) for d in deltas],
             ("response.output_item.done", {"item": item}),
             ("response.incomplete" if final["status"] == "incomplete" else "response.completed", {"response": final})]
    return [(name, {"type": name, "sequence_number": i, **fields}) for i, (name, fields) in enumerate(names)]


def test_a_whole_response_is_incomplete_only_when_cut_off_at_the_limit() -> None:
    assert check_response(_response("hi", 3, 8), 8) == "valid"
    assert check_response(_response("hi", 8, 8), 8) == "valid"
    eos_last = _response("hi", 8, 8)
    eos_last["status"], eos_last["incomplete_details"] = "completed", None
    assert check_response(eos_last, 8) == "valid"  # its last allowed token ended it
    early = _response("hi", 5, 8)
    early["status"], early["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
    assert check_response(early, 8).startswith("invalid: status")
    unsaid = _response("hi", 8, 8)
    unsaid["incomplete_details"] = None
    assert check_response(unsaid, 8).startswith("invalid: status")
    assert check_response(_response("hi", 9, 8), 8).startswith("invalid: usage")
    bad_sum = _response("hi", 3, 8)
    bad_sum["usage"]["total_tokens"] = 7
    assert check_response(bad_sum, 8).startswith("invalid: usage")
    assert check_response({"object": "chat.completion"}, 8).startswith("invalid: not a Response")


def test_a_response_stream_is_checked_for_order_numbering_and_its_joined_text() -> None:
    final = _response("Hello world", 4, 16)
    assert check_response_stream(_response_events(["Hello", " world"], final), 16) == "valid"
    assert check_response_stream(_response_events(["Hello", " there"], final), 16).startswith("invalid: the deltas")
    gap = _response_events(["Hello", " world"], final)
    gap[3][1]["sequence_number"] = 9
    assert check_response_stream(gap, 16).startswith("invalid: event 3")
    assert check_response_stream(_response_events(["Hello world"], final)[1:], 16).startswith("invalid: opens")
    outside = _response_events(["Hello world"], final)
    outside[3][1]["item_id"] = "msg_2"
    assert check_response_stream(outside, 16).startswith("invalid: a text delta outside")
    assert check_response_stream(_response_events(["x"], final)[:-1], 16).startswith("invalid: ends with")


def _message_events(stop: str, out: int, blocks: int = 1) -> list[tuple[str, dict]]:
    names: list[tuple[str, dict]] = [("message_start", {"message": {}}), ("ping", {})]
    for i in range(blocks):
        names += [("content_block_start", {"index": i}), ("content_block_delta", {"index": i}),
                  ("content_block_stop", {"index": i})]
    names += [("message_delta", {"delta": {"stop_reason": stop}, "usage": {"output_tokens": out}}),
              ("message_stop", {})]
    return [(name, {"type": name, **fields}) for name, fields in names]


def test_a_message_stream_opens_fills_and_closes_its_blocks_in_order() -> None:
    assert check_message_stream(_message_events("end_turn", 3, blocks=2), 8) == "valid"
    assert check_message_stream(_message_events("max_tokens", 8), 8) == "valid"
    assert check_message_stream(_message_events("max_tokens", 5), 8).startswith("invalid: stop_reason")
    assert check_message_stream(_message_events("end_turn", 8), 8) == "valid"  # its last token ended it
    assert check_message_stream(_message_events("max_tokens", 9), 8).startswith("invalid: stop_reason")
    assert check_message_stream(_message_events("length", 3), 8).startswith("invalid: stop_reason")
    skipped = _message_events("end_turn", 3, blocks=2)
    skipped[5][1]["index"] = 2  # the second block starts at 2
    assert check_message_stream(skipped, 8).startswith("invalid: block 2")
    unclosed = [e for e in _message_events("end_turn", 3) if e[0] != "content_block_stop"]
    assert check_message_stream(unclosed, 8).startswith("invalid: a second message_delta, or one inside")
    assert check_message_stream(_message_events("end_turn", 3)[:-1], 8).startswith("invalid:")


def test_a_whole_message() -> None:
    good = {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "hi"}],
            "stop_reason": "end_turn", "usage": {"input_tokens": 4, "output_tokens": 2}}
    assert check_message(good, 8) == "valid"
    assert check_message({**good, "content": [{"type": "image"}]}, 8).startswith("invalid: content")
    assert check_message({**good, "role": "user"}, 8).startswith("invalid: not a Message")


def test_sse_frames_pair_names_with_payloads_and_skip_done() -> None:
    stream = EventStream()
    lines = [b"event: response.created\n", b'data: {"type": "response.created"}\n', b"\n", b"data: [DONE]\n"]
    assert [stream.add_line(line) for line in lines] == [None, "response.created", None, None]
    assert stream.events == [("response.created", {"type": "response.created"})]


def test_chains_continue_a_stored_response_a_few_turns_then_start_again() -> None:
    chains, rng = ResponseChains(), random.Random(0)
    continued = 0
    for i in range(200):
        path, body = api_request("responses", rng, "m", "hi", 8, False, chains)
        assert path == "/v1/responses"
        previous = body.get("previous_response_id")
        if previous is not None:
            assert previous == chains.last and chains.turns < 3
            continued += 1
        chains.answered({"id": f"resp_{i}"}, previous is not None, body.get("store", True))
    assert continued > 20
    stored = chains.stored[-1]
    chains.forget(stored)
    assert stored not in chains.stored and chains.last is None
    assert api_request("messages", rng, "m", "hi", 8, True, chains)[0] == "/v1/messages"
