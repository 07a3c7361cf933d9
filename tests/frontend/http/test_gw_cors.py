"""CORS: off by default; with --allowed-origins, preflights are answered before the key
check and every response (JSON, SSE stream, error object) carries the headers."""
from __future__ import annotations

from pathlib import Path

import pytest

from gw_fakes import FakeBackend, GatewayServer, http, post
from kvserve.frontend.cli.serve_cmd import build_parser
from kvserve.frontend.http.cors_policy import CorsPolicy, cors_policy_from_args
from kvserve.frontend.http.gateway_config import GatewayConfig

APP = "https://app.example"
KEY = "sk-cors-key"
PREFLIGHT = {"Origin": APP, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


@pytest.fixture(scope="module")
def cors_server(tokenizer_dir: Path):
    config = GatewayConfig(served_model_names=["tiny"], api_key=KEY, cors=CorsPolicy(origins=(APP,)))
    with GatewayServer(FakeBackend(), config, tokenizer_dir) as srv:
        yield srv


def test_a_preflight_from_an_allowed_origin_is_answered_without_a_key(cors_server) -> None:
    r = http("OPTIONS", f"{cors_server.url}/v1/chat/completions", headers=PREFLIGHT)
    assert r.status == 204
    assert r.headers["access-control-allow-origin"] == APP and r.headers["vary"] == "Origin"
    assert r.headers["access-control-allow-methods"] == "POST"
    assert r.headers["access-control-allow-headers"] == "authorization, content-type"
    assert "access-control-allow-credentials" not in r.headers


def test_a_preflight_from_another_origin_is_refused_without_cors_headers(cors_server) -> None:
    r = http("OPTIONS", f"{cors_server.url}/v1/chat/completions", headers={**PREFLIGHT, "Origin": "https://evil.example"})
    assert r.status == 400 and r.json()["error"]["code"] == "cors_refused"
    assert "access-control-allow-origin" not in r.headers


def test_every_response_to_an_allowed_origin_carries_the_header(cors_server) -> None:
    auth = {"Origin": APP, "Authorization": f"Bearer {KEY}"}
    body = {"model": "tiny", "prompt": "p", "max_tokens": 2}
    for stream in (False, True):
        r = post(f"{cors_server.url}/v1/completions", {**body, "stream": stream}, headers=auth)
        assert r.status == 200 and r.headers["access-control-allow-origin"] == APP, stream
    assert ("text/event-stream" in r.headers["content-type"]) and b"[DONE]" in r.body
    # Errors too, or the page could not read why its request failed.
    r = post(f"{cors_server.url}/v1/completions", body, headers={"Origin": APP})
    assert r.status == 401 and r.headers["access-control-allow-origin"] == APP
    r = post(f"{cors_server.url}/v1/completions", body, headers={**auth, "Origin": "https://evil.example"})
    assert r.status == 200 and "access-control-allow-origin" not in r.headers


def test_cors_is_off_by_default(server) -> None:
    r = http("OPTIONS", f"{server.url}/v1/completions", headers=PREFLIGHT)
    assert r.status == 405 and "access-control-allow-origin" not in r.headers
    r = post(f"{server.url}/v1/completions", {"model": "tiny", "prompt": "p", "max_tokens": 1}, headers={"Origin": APP})
    assert r.status == 200 and "access-control-allow-origin" not in r.headers


def test_wildcard_origin_and_credentials() -> None:
    assert CorsPolicy(origins=("*",)).response_headers(APP) == {"Access-Control-Allow-Origin": "*"}
    # Browsers refuse "*" with credentials: the origin is named instead.
    assert CorsPolicy(origins=("*",), allow_credentials=True).response_headers(APP) == {
        "Access-Control-Allow-Origin": APP, "Vary": "Origin", "Access-Control-Allow-Credentials": "true"}
    limited = CorsPolicy(origins=(APP,), methods=("POST",), headers=("Authorization",))
    assert limited.allows_method("post") and not limited.allows_method("DELETE")
    assert limited.allow_headers("x-anything") == "Authorization"


def test_flags_take_vllms_json_lists() -> None:
    args = build_parser().parse_args(["--allowed-origins", f'["{APP}"]', "--allowed-methods", '["POST", "GET"]',
                                      "--allow-credentials"])
    policy = cors_policy_from_args(args)
    assert policy.origins == (APP,) and policy.methods == ("POST", "GET") and policy.allow_credentials
    assert not cors_policy_from_args(build_parser().parse_args([])).enabled
    for bad in ("https://app.example", '"*"', "[1]"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--allowed-origins", bad])
