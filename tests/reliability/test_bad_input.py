"""Bad input through HTTP: every case is a 4xx with a small OpenAI error object
that echoes nothing of the input and shows nothing of the server; never a 5xx;
and the server serves normally afterwards.

Decision on top_k (documented in docs/security.md): 0 and -1 both mean "disabled", as in
vLLM and the OpenAI-compatible servers; below -1 or above the vocabulary size
is a 400. So top_k 0 is not bad input: it is checked here to behave exactly
like no top_k at all.
"""
from __future__ import annotations

import json

from tests.reliability.served import Reply, Served

CANARY = "CANARY-7f3a9c-PROMPT"
VOCAB = 512  # the tiny test model's vocabulary
P = f"{CANARY} tell me"  # a valid prompt carrying the canary
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
JSON = {"Content-Type": "application/json"}


def raw(text: str | bytes) -> bytes:
    return text.encode("utf-8") if isinstance(text, str) else text


def cases() -> list[tuple[str, str, bytes, dict[str, str]]]:
    c: list[tuple[str, str, bytes, dict[str, str]]] = []

    def add(name: str, body, path: str = COMPLETIONS, headers: dict[str, str] | None = None) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        c.append((name, path, data, headers or JSON))

    def field(name: str, value, path: str = COMPLETIONS) -> None:
        base = {"model": "tiny", "prompt": P} if path == COMPLETIONS else \
            {"model": "tiny", "messages": [{"role": "user", "content": P}]}
        add(f"{name}={str(value)[:20]}", {**base, name: value}, path)

    # Not JSON, not an object, not UTF-8, not sane.
    add("invalid json", raw('{"prompt": "' + CANARY + '", "max_tokens": 5'))
    for value in ([1, 2], "text", 5, None, True):
        add(f"non-object {value!r}", value)
    add("invalid utf-8", b'{"prompt": "\xff\xfe ' + CANARY.encode() + b'"}')
    add("lone surrogate", raw('{"prompt": "\\ud800 ' + CANARY + '"}'))
    add("deeply nested", raw('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}"))
    add("nested 500", raw('{"prompt": ' + "[" * 500 + "]" * 500 + "}"))
    add("oversized body", {"prompt": CANARY + "x" * (1024 * 1024 + 10)})
    add("not json content type", raw('{"prompt": "x"}'), headers={"Content-Type": "text/plain"})
    add("huge integer", raw('{"prompt": "x", "n": 1' + "0" * 5000 + "}"))
    # Missing fields.
    add("no prompt", {"model": "tiny", "max_tokens": 3})
    add("no messages", {"model": "tiny"}, CHAT)
    add("message without role", {"messages": [{"content": P}]}, CHAT)
    add("message without content", {"messages": [{"role": "user"}]}, CHAT)
    add("tokenize nothing", {"model": "tiny"}, "/tokenize")
    add("detokenize nothing", {"model": "tiny"}, "/detokenize")
    # Unknown model.
    field("model", "gpt-99-unknown")  # a model name may be quoted back (bounded), as OpenAI does
    field("model", "gpt-99", CHAT)
    # Wrong types.
    for name, value in [("prompt", 5), ("prompt", {"a": CANARY}), ("prompt", [CANARY, 5]), ("max_tokens", "5"),
                        ("max_tokens", 5.5), ("max_tokens", True), ("temperature", "hot"), ("stream", "yes"),
                        ("n", True), ("stop", 5), ("stop", [CANARY, 5]), ("logit_bias", [1]), ("model", 7),
                        ("stream_options", "x"), ("seed", "1"), ("echo", "yes"), ("logprobs", "x"),
                        ("top_k", 1.5), ("timeout", "soon"), ("cache_salt", 5), ("user", 5)]:
        field(name, value)
    for name, value in [("messages", CANARY), ("messages", [{"role": 5, "content": P}]),
                        ("messages", [{"role": "user", "content": 5}]), ("messages", [[CANARY]]),
                        ("messages", [{"role": ["user"], "content": P}]), ("logprobs", 1),
                        ("top_logprobs", 3), ("max_completion_tokens", "9")]:
        field(name, value, CHAT)
    add("tokenize wrong type", {"prompt": 5}, "/tokenize")
    add("detokenize wrong type", {"tokens": "1 2"}, "/detokenize")
    # Out of range.
    for value in (float("nan"), float("inf"), float("-inf"), -0.5, 2.5):
        add(f"temperature={value}", raw('{"prompt": "x", "temperature": ' + json.dumps(value) + "}"))
    for name, values in [("top_p", [0, -0.1, 1.5]), ("top_k", [-2, VOCAB + 1, 10**9]),
                         ("n", [0, -1, 17, 10**6, 10**30]), ("max_tokens", [0, -5, 10**12, 2**70]),
                         ("min_p", [-0.1, 1.1]), ("presence_penalty", [3]), ("frequency_penalty", [-3]),
                         ("repetition_penalty", [0, 5]), ("logprobs", [-1, 21]), ("seed", [2**63, 2**64, -(2**63) - 1]),
                         ("timeout", [0, -1, 10**9]), ("min_tokens", [-1, 10**6, 2**63]), ("best_of", [3])]:
        for value in values:
            field(name, value)
    field("max_completion_tokens", 10**9, CHAT)
    field("top_logprobs", 100, CHAT)
    add("top_logprobs without logprobs", {"messages": [{"role": "user", "content": P}], "top_logprobs": 2}, CHAT)
    # Context length: prompt + max_tokens over --max-model-len (256).
    add("ids over context", {"prompt": [5] * 200, "max_tokens": 100})
    add("text over context", {"prompt": CANARY + " word" * 400, "max_tokens": 8})
    add("chat over context", {"messages": [{"role": "user", "content": CANARY + " word" * 400}]}, CHAT)
    # Empty inputs.
    for value in ("", [], [[]], [""], [[1], []]):
        field("prompt", value)
    field("messages", [], CHAT)
    # Token ids out of the vocabulary.
    for value in ([VOCAB], [-1], [[1, 2**40]], [1, 2**70]):
        field("prompt", value)
    field("stop_token_ids", [VOCAB + 5])
    field("logit_bias", {str(VOCAB): 1})
    field("logit_bias", {"1": float(200)})
    add("detokenize out of range", {"tokens": [VOCAB * 10]}, "/detokenize")
    # Stop strings: thousands of them, empty ones, very long ones.
    field("stop", ["s"] * 5000)
    field("stop", [""])
    field("stop", ["y" * 300])
    field("stop_token_ids", list(range(100)))
    field("logit_bias", {str(i): 1 for i in range(2000)})
    # Unsupported features answer 400, not 500.
    field("tools", [{"type": "function", "function": {"name": "f"}}], CHAT)  # "auto" without the server flags
    field("response_format", {"type": "xml"}, CHAT)
    # Constraints that do not compile, or that the engine would only half enforce, answer 400 too.
    field("guided_json", {"type": "object", "not": {}})
    field("guided_json", "{" * 5000)
    field("guided_regex", "(" * 3000)
    field("guided_grammar", "root ::= ")
    field("structured_outputs", {"json": {"type": "string", "description": "d" * 100_000}})
    field("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], CHAT)
    return c


def check_error_reply(name: str, reply: Reply) -> None:
    assert 400 <= reply.status < 500, (name, reply.status, reply.body[:200])
    assert reply.headers.get("content-type", "").startswith("application/json"), name
    assert len(reply.body) < 2048, (name, len(reply.body))  # bounded: no echo of a large input
    body = reply.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, name
    assert body["error"]["message"] and isinstance(body["error"]["type"], str), name
    text = reply.body.decode("utf-8")
    for leak in (CANARY, "Traceback", 'File "', ".py", "/work/", "site-packages"):
        assert leak not in text, (name, leak, text)


def test_bad_input_sweep_is_all_4xx(main_server: Served) -> None:
    seen: dict[int, int] = {}
    for name, path, data, headers in cases():
        try:
            reply = main_server.request("POST", path, raw=data, headers=headers)
        except (BrokenPipeError, ConnectionResetError):
            # Only the oversized body may be refused before the client finished sending it.
            assert name == "oversized body", name
            continue
        check_error_reply(name, reply)
        seen[reply.status] = seen.get(reply.status, 0) + 1
    assert seen.get(413, 0) <= 1 and seen[404] >= 2 and seen[415] == 1 and seen[400] > 100, seen
    # Wrong routes and methods, with the key: 4xx error objects too.
    for method, path in (("GET", "/v1/completions"), ("DELETE", "/v1/models"), ("GET", "/v1/nothing"),
                         ("GET", "/v1/models/no-such-model")):
        check_error_reply(path, main_server.request(method, path))
    # And the server still serves, with nothing left in the engine.
    out = main_server.complete(model="tiny", prompt="Once upon a time", max_tokens=4, temperature=0)
    assert out["choices"][0]["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 4
    assert main_server.get("/health", key=None).status == 200
    assert main_server.wait_idle(2.0) == (0, 0, 0)


def test_edge_values_that_are_valid_succeed(main_server: Served) -> None:
    """Values at the edges are accepted: top_k 0 and -1 mean no top-k (same output
    as leaving it out), the largest seed with n > 1 (int64, as in vLLM; its second child's
    seed passes it: a wrapping child seed once left an orphan request behind that broke every
    later engine step)."""
    base = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 6, "temperature": 1.0, "seed": 5}
    plain = main_server.complete(**base)["choices"][0]["text"]
    for top_k in (0, -1):
        assert main_server.complete(**base, top_k=top_k)["choices"][0]["text"] == plain
    assert main_server.complete(**base, top_k=VOCAB)["choices"][0]["text"] == plain  # the whole vocabulary
    out = main_server.complete(**{**base, "seed": 2**63 - 1, "n": 2})
    assert [c["finish_reason"] for c in out["choices"]] == ["length", "length"]
    chat = main_server.post(CHAT, {"model": "tiny", "messages": [{"role": "user", "content": ""}], "max_tokens": 2})
    assert chat.status == 200  # an empty message still renders a non-empty conversation
    out = main_server.complete(model="tiny", prompt="hi", max_tokens=2, timeout=86400)  # the longest timeout
    assert out["usage"]["completion_tokens"] == 2
