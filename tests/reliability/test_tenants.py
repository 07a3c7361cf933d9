"""Tenant isolation of the prefix cache.

API keys map to tenants (`--api-keys-file` with `KEY TENANT` lines; `--api-key`
keys are tenant "default"). The salt the engine sees is derived from the
authenticated tenant and the client's own `cache_salt`, so the same prompt
hits the cache only within one tenant (and one client salt), and no client
can name its way into another tenant's entries.
"""
from __future__ import annotations

import hashlib
import json
import queue
import uuid
from pathlib import Path

import numpy as np

import pytest

from kvserve.frontend.http.api_keys import KeyFileError, load_api_keys, parse_keys_file
from kvserve.frontend.http.cache_salt import effective_cache_salt
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


def test_keys_file_and_salt_derivation() -> None:
    assert parse_keys_file("# key tenant\n\nsk-1 acme\n  sk-2   globex  \nsk-3 acme\n") == \
        {"sk-1": "acme", "sk-2": "globex", "sk-3": "acme"}
    for bad in ("sk-lonely\n", "sk-1 acme extra\n", "sk-1 acme\nsk-1 globex\n"):
        with pytest.raises(KeyFileError) as info:
            parse_keys_file(bad)
        assert "sk-" not in str(info.value)  # a key is a secret: never quoted back
    assert load_api_keys(["k1", "k2", ""], None) == {"k1": "default", "k2": "default"}
    secret = b"deployment secret"
    assert effective_cache_salt(secret, None, None) is None  # no auth, no salt: one shared cache, as before
    salts = {effective_cache_salt(secret, t, s) for t in ("acme", "globex", None) for s in ("x", None)}
    assert len(salts - {None}) == 5  # every (tenant, client salt) pair is its own scope
    assert effective_cache_salt(secret, "acme", "x\u0000y") != effective_cache_salt(secret, "acme\u0000x", "y")
    assert effective_cache_salt(secret, "acme", "x") not in ("x", "acme")
    assert effective_cache_salt(secret, "acme", None) != effective_cache_salt(b"another", "acme", None)


def _direct_cached_tokens(served: Served, ids: list[int], salt: str) -> int:
    """A request straight at the backend's gRPC port (as anything inside the cluster could send)."""
    import tritonclient.grpc as grpcclient

    inputs = [grpcclient.InferInput("input_ids", [len(ids)], "INT32"),
              grpcclient.InferInput("sampling_parameters", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array(ids, dtype=np.int32))
    inputs[1].set_data_from_numpy(np.array([json.dumps({"max_tokens": 1, "cache_salt": salt}).encode()],
                                           dtype=np.object_))
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(served.backend)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("llm", inputs, request_id="probe")
        while True:
            result, error = results.get(timeout=30)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                return int(result.as_numpy("cached_tokens")[0])
    finally:
        client.stop_stream()
        client.close()


def test_a_tenant_salt_cannot_be_computed_from_the_tenant_name(main_server: Served, main_state_dir: Path) -> None:
    # Tenant A's prompt in the cache; a client of the backend's gRPC port that knows A's name
    # (and how salts were once made: a plain hash of it) probes for it through cached_tokens.
    ids = [int(t) for t in np.random.default_rng().integers(10, 400, size=64)]
    reply = main_server.post("/v1/completions", {"model": "tiny", "prompt": ids, "max_tokens": 1}, key=KEY_A)
    assert reply.status == 200, reply.body[:300]
    public = "t-" + hashlib.sha256(json.dumps(["tenant-a", None]).encode()).hexdigest()
    assert _direct_cached_tokens(main_server, ids, public) == 0
    # Only the deployment's secret (generated and kept 0600 in the state folder) makes the salt.
    files = list(main_state_dir.rglob("cache-salt-secret"))
    assert len(files) == 1 and files[0].stat().st_mode & 0o077 == 0
    secret = files[0].read_text().strip().encode()
    assert _direct_cached_tokens(main_server, ids, effective_cache_salt(secret, "tenant-a", None)) >= 48

