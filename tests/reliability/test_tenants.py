"""Tenant isolation of the prefix cache.

API keys map to tenants (`--api-keys-file` with `KEY TENANT` lines; `--api-key`
keys are tenant "default"). The salt the engine sees is derived from the
authenticated tenant and the client's own `cache_salt`, so the same prompt
hits the cache only within one tenant (and one client salt), and no client
can name its way into another tenant's entries.
"""
from __future__ import annotations

import uuid

from tests.reliability.conftest import MAIN_KEY
from tests.reliability.served import Served

KEY_A, KEY_B = "sk-tenant-a", "sk-tenant-b"


def cached(served: Served, key: str, prompt: str, **extra) -> int:
    reply = served.post("/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0,
                                            **extra}, key=key)
    assert reply.status == 200, reply.body[:300]
    usage = reply.json()["usage"]
    assert usage["prompt_tokens"] >= 48  # three full blocks at least, so a hit is possible
    return usage["prompt_tokens_details"]["cached_tokens"]


def test_prefix_cache_is_shared_within_a_tenant_only(main_server: Served) -> None:
    prompt = f"tenant isolation {uuid.uuid4().hex} " + "the cache must not cross tenants " * 8
    assert cached(main_server, KEY_A, prompt) == 0
    assert cached(main_server, KEY_A, prompt) > 0  # same tenant: hit
    assert cached(main_server, KEY_B, prompt) == 0  # other tenant, same prompt: miss
    assert cached(main_server, KEY_B, prompt) > 0
    assert cached(main_server, MAIN_KEY, prompt) == 0  # the default tenant is a tenant too

    # A client salt scopes further inside the tenant, and naming the same salt
    # from another tenant does not reach the first tenant's entries.
    salted = f"salted {uuid.uuid4().hex} " + "a salt scopes within the tenant " * 8
    assert cached(main_server, KEY_A, salted, cache_salt="team-1") == 0
    assert cached(main_server, KEY_A, salted, cache_salt="team-1") > 0
    assert cached(main_server, KEY_A, salted, cache_salt="team-2") == 0
    assert cached(main_server, KEY_A, salted) == 0
    assert cached(main_server, KEY_B, salted, cache_salt="team-1") == 0
