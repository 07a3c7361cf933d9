"""A request body is UTF-8 JSON or a 400: never a 5xx from bytes the JSON parser lets through.

`json.loads(bytes)` guesses UTF-16/32 from the first bytes and decodes with
"surrogatepass", so raw bytes ED A0 80 (an encoded lone surrogate) inside a
string, or a UTF-16 body holding one, became text that no later step could
encode again: a 500 from /v1/completions, /v1/chat/completions and /tokenize.
"""
from __future__ import annotations

import json

import pytest

from tests.reliability.served import Served

CANARY = "CANARY-5e1d2b"
SURROGATE = b"\xed\xa0\x80"  # U+D800 written as if it were a character (CESU-style), not UTF-8
JSON = {"Content-Type": "application/json"}


def _bodies() -> list[tuple[str, str, bytes]]:
    completion = {"model": "tiny", "prompt": f"{CANARY} hi", "max_tokens": 2}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": f"{CANARY} hi"}], "max_tokens": 2}
    tokenize = {"model": "tiny", "prompt": f"{CANARY} hi"}
    cases = []
    for path, body in (("/v1/completions", completion), ("/v1/chat/completions", chat), ("/tokenize", tokenize)):
        text = json.dumps(body, ensure_ascii=False)
        cases.append((f"{path} raw surrogate", path, text.replace(" hi", " h\udc00i").encode("utf-8", "surrogatepass")
                      .replace(b"\xed\xb0\x80", SURROGATE)))
        cases.append((f"{path} surrogate pair as two raw halves", path,
                      text.replace(" hi", " \ud83d\ude00").encode("utf-8", "surrogatepass")))
        for codec in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"):
            cases.append((f"{path} {codec}", path, text.encode(codec)))
        cases.append((f"{path} utf-16 lone surrogate", path,
                      text.replace(" hi", " h\ud800i").encode("utf-16-le", "surrogatepass")))
        cases.append((f"{path} latin-1", path, text.replace(" hi", " h\u00e9").encode("latin-1")))
    cases.append(("/detokenize raw surrogate in model", "/detokenize",
                  b'{"model": "tiny' + SURROGATE + b'", "tokens": [1, 2]}'))
    return cases


@pytest.mark.parametrize("name,path,data", _bodies(), ids=[c[0] for c in _bodies()])
def test_a_body_that_is_not_utf8_text_is_a_400(main_server: Served, name: str, path: str, data: bytes) -> None:
    reply = main_server.request("POST", path, raw=data, headers=JSON)
    assert reply.status == 400, (name, reply.status, reply.body[:200])
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and CANARY not in error["message"], error


def test_unusual_but_valid_text_still_works(main_server: Served) -> None:
    """Characters beyond the BMP, raw or as an escaped surrogate pair, and NUL are text."""
    for prompt in ("h\U0001F600i", "a\u0000b", "\u00e9\u4e2d"):
        raw = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 2}, ensure_ascii=False).encode()
        assert main_server.request("POST", "/v1/completions", raw=raw, headers=JSON).status == 200, prompt
    escaped = b'{"model": "tiny", "prompt": "h\\ud83d\\ude00i", "max_tokens": 2}'
    assert main_server.request("POST", "/v1/completions", raw=escaped, headers=JSON).status == 200
    chat = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "\U0001F600"}], "max_tokens": 2},
                      ensure_ascii=False).encode()
    assert main_server.request("POST", "/v1/chat/completions", raw=chat, headers=JSON).status == 200
    assert main_server.wait_idle(5.0) == (0, 0, 0)
