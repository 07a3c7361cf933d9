"""One digest for an API key, at start-up and for each presented token: a key that a shell hands over
with undecodable bytes (os.fsdecode's lone surrogates) is still a key, and it matches itself."""
from __future__ import annotations

import os

from gw_fakes import FakeBackend
from kvserve.frontend.http.api_keys import DEFAULT_TENANT, key_digest, match_key
from kvserve.frontend.http.gateway import Gateway
from kvserve.frontend.http.gateway_config import GatewayConfig


def test_the_gateways_key_table_uses_the_digest_tokens_are_matched_with() -> None:
    odd = os.fsdecode(b"sk-\xff\xfe")  # what argv gives for a key with bytes that are not UTF-8
    config = GatewayConfig(served_model_names=["tiny"], api_key=odd, api_keys={"sk-b": "team-b"})
    gateway = Gateway(config, FakeBackend())
    assert sorted(t for _, t in gateway.key_digests) == [DEFAULT_TENANT, "team-b"]
    assert (key_digest(odd), DEFAULT_TENANT) in gateway.key_digests
    assert match_key(odd, gateway.key_digests) == DEFAULT_TENANT
    assert match_key("sk-b", gateway.key_digests) == "team-b"
    assert match_key("sk-\ufffd\ufffd", gateway.key_digests) is None
