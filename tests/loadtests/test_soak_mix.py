"""The soak's constrained requests and slow readers: the answer check fails what it must, and a
short soak against a real server counts each kind, checks the constrained and the Responses and
Messages answers, and passes."""
from __future__ import annotations

import asyncio
import json
import random

import aiohttp
import pytest

from kvserve.loadtests.bench.sustained import soak
from kvserve.loadtests.bench.sustained.soak_apis import API_KINDS
from kvserve.loadtests.bench.sustained.soak_mix import CONSTRAINED_KINDS, StreamJoin, check_answer, constrained_body
from tests.conftest import tiny_model
from tests.reliability.served import start_served


def test_the_check_passes_valid_answers_and_fails_the_rest() -> None:
    rng = random.Random(3)
    person = constrained_body("json_schema", rng)
    person["response_format"]["json_schema"]["schema"] = {
        "type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    assert check_answer("json_schema", person, '{"age": 3}', [], "stop") == "valid"
    assert check_answer("json_schema", person, '{"age": "3"}', [], "stop").startswith("invalid: schema")
    assert check_answer("json_schema", person, '{"age": 3', [], "stop").startswith("invalid: not JSON")
    assert check_answer("json_schema", person, '{"age": 3', [], "length") == "truncated"
    assert check_answer("json_object", {}, "[1]", [], "stop").startswith("invalid")
    assert check_answer("json_object", {}, '{"a": 1}', [], "stop") == "valid"
    tools = constrained_body("tools", rng)
    tools["tool_choice"] = {"type": "function", "function": {"name": "get_time"}}
    good = [{"name": "get_time", "arguments": '{"tz": "Europe/Paris"}'}]
    assert check_answer("tools", tools, None, good, "tool_calls") == "valid"
    assert check_answer("tools", tools, None, good, "stop").startswith("invalid")  # a call must end as one
    assert check_answer("tools", tools, None, [{"name": "get_time", "arguments": '{"tz": 5}'}],
                        "tool_calls").startswith("invalid: schema")
    assert check_answer("tools", tools, None, [{"name": "get_weather", "arguments": '{"city": "a", "unit": '
                                                '"celsius"}'}], "tool_calls").startswith("invalid: called")


def test_a_stream_joins_to_the_whole_answer() -> None:
    join = StreamJoin()
    for delta in [{"role": "assistant", "content": ""},
                  {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                   "function": {"name": "get_time", "arguments": ""}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": '{"tz": '}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": '"UTC"}'}}]}]:
        join.add({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    join.add({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    assert join.joined() == ("", [{"name": "get_time", "arguments": '{"tz": "UTC"}'}], "tool_calls")


class _PathRecorder:
    """A session whose every POST fails at once, after noting where it went."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def post(self, url: str, **_: object):
        self.paths.append(url.rsplit("/v1/", 1)[1])
        raise aiohttp.ClientConnectionError("recorded")


def test_without_chat_every_request_is_a_completion() -> None:
    def paths(flags: list[str]) -> set[str]:
        args = soak.build_parser().parse_args(["--model", "m", *flags])
        if not args.chat:
            args.constrained_fraction = args.api_fraction = 0.0  # as main() sets them
        session, rng, counts = _PathRecorder(), random.Random(0), soak.Counts()
        for _ in range(200):
            asyncio.run(soak.one_request(session, args, rng, counts))
        return set(session.paths)

    assert paths(["--no-chat"]) == {"completions"}
    assert paths([]) == {"completions", "chat/completions", "responses", "messages"}


def test_slow_readers_are_a_tenth_of_the_clients() -> None:
    assert [soak.slow_reader_count(c, 0.1) for c in (1, 8, 16, 32)] == [1, 1, 2, 3]
    assert soak.slow_reader_count(16, 0) == 0


@pytest.fixture(scope="module")
def server():
    served = start_served(["--model", tiny_model("llama"), "--served-model-name", "tiny", "--max-model-len", "1024",
                           "--max-num-seqs", "16"])
    try:
        yield served
    finally:
        served.stop(timeout=60)


def test_a_short_soak_counts_each_kind_and_checks_the_constrained_answers(server, tmp_path) -> None:
    out = tmp_path / "soak.json"
    soak.main(["--url", server.url, "--minutes", "0.4", "--concurrency", "6", "--slow-fraction", "0.2",
                      "--constrained-fraction", "0.5", "--constrained-max-tokens", "48", "--slow-max-tokens", "96",
                      "--api-fraction", "0.6",
                      "--warmup-minutes", "0", "--sample-every", "1", "--pid", str(server.proc.pid),
                      "--out", str(out)])
    report = json.loads(out.read_text())
    counts = report["counts"]
    assert report["slow_readers"] == 1
    assert counts["kinds"]["slow"].get("200", 0) >= 1, counts["kinds"]
    assert set(CONSTRAINED_KINDS) <= set(counts["kinds"]), counts["kinds"]
    assert sum(sum(c.values()) for c in counts["checks"].values()) >= 1, counts  # answers were checked
    # Not asserted here: invalid answers. The tiny model's random text finds what a grammar
    # cannot rule out (a 31st of September for "format": "date"); the soak reports them and fails
    # on them, which the first test covers.
    # The APIs' answers are checked for their shape, which holds whatever text the model writes.
    assert set(API_KINDS) <= set(counts["kinds"]), counts["kinds"]
    for kind in (*API_KINDS, "responses_store"):
        assert counts["checks"].get(kind, {}).get("invalid", 0) == 0, counts["invalid_answers"]
    assert sum(counts["checks"].get(kind, {}).get("valid", 0) for kind in API_KINDS) >= 2, counts["checks"]
    assert counts["unexpected_4xx"] == 0, counts["kinds"]
    assert counts["server_errors"] == counts["transport_errors"] == 0, counts["by_status"]
    # The engine's process is judged less the KV cache it has touched, which the engine exports.
    assert [p["kv_cache_touched_excluded"] for p in report["processes"].values()].count(True) == 1
    assert report["samples"][-1]["kv_touched"] > 0
    assert len(counts["invalid_answers"]) == min(20, sum(c.get("invalid", 0) for c in counts["checks"].values()))
    assert counts["server_errors"] == 0 and counts["transport_errors"] == 0
    assert report["idle_after"], report["engine_after"]  # (24 s is too short a window to judge RSS growth)
