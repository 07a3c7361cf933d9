"""Admission on the real host (model.py in the embedded host, driven over gRPC the
way the gateway drives it): an abort that comes while a prompt is still being
tokenized wins, and huge text prompts hold nobody else up.

The prompts are long text: tokenizing them takes time (60k characters take
~0.1 s here), which is the window these tests aim at.
"""
from __future__ import annotations

import asyncio
import json
import random
import re
import time

import pytest

from kvserve.backend.models.tiny import TinySpec, make_tiny_model
from kvserve.frontend.backend_client.protocol import BackendRejected, GenerateRequest
from kvserve.frontend.backend_client.triton_client import TritonBackendClient
from kvserve.seam.error_wire import ErrorKind
from tests.conftest import MODEL_CACHE
from tests.utils.processes import run_host

MAX_MODEL_LEN = 32768
WORDS = "the quick brown fox jumps over a lazy dog once upon a time there was".split()


def _text(chars: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(chars // 4))[:chars]


@pytest.fixture(scope="module")
def host():
    model = make_tiny_model(MODEL_CACHE / "llama-32k", TinySpec(max_position=MAX_MODEL_LEN))
    env = {"KVSERVE_MODEL": str(model), "KVSERVE_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
           "KVSERVE_LOG_SCHEDULING": "true", "KVSERVE_MAX_NUM_SEQS": "8"}
    with run_host(env) as h:
        yield h


def _events(host, prefix: str) -> list[str]:
    out = []
    for line in list(host.output):
        try:
            event = json.loads(line).get("event", "")
        except ValueError:
            continue
        if prefix in event:
            out.append(event)
    return out


def test_an_abort_during_tokenization_wins(host) -> None:
    """The client leaves while its 60k-character prompt is being tokenized: the
    request must never run (before, it was added after its abort and generated
    to the end, holding KV blocks, with nobody listening)."""
    prompt = _text(60_000, seed=1)

    async def body():
        client = TritonBackendClient(host.grpc_url)
        try:
            for i in range(3):
                req = GenerateRequest(f"zombie{i}", prompt, {"max_tokens": 64, "ignore_eos": True,
                                                             "temperature": 0})
                task = asyncio.create_task(_first(client, req))
                await asyncio.sleep(0.03)  # the host has it and is tokenizing
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        finally:
            await client.close()

    asyncio.run(body())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ended = [e for i in range(3) for e in _events(host, f"request zombie{i}-") if "ended" in e]
        if len(ended) == 3:
            break
        time.sleep(0.1)
    events = [e for i in range(3) for e in _events(host, f"request zombie{i}-")]
    # Every one was aborted: before it ran (the cancel came while it was tokenized), or, on a
    # slow machine where tokenizing ended first, while it ran. Before, a cancel that came during
    # tokenization was lost: the request ran to the end and never logged an abort.
    for i in range(3):
        mine = [e for e in events if e.startswith(f"request zombie{i}-")]
        assert any(re.search(r"ended \(abort\)", e) for e in mine), events
        if any(e.endswith("ended (abort): never scheduled") for e in mine):
            assert not any(re.fullmatch(r"request \S+ scheduled", e) for e in mine), events
    assert host.metric("kvserve:num_requests_running") == 0
    assert host.metric("kvserve:num_requests_waiting") == 0


async def _first(client: TritonBackendClient, req: GenerateRequest):
    async for delta in client.generate(req):
        return delta
    return None


def test_huge_prompts_do_not_hold_up_a_short_one(host) -> None:
    """Megabyte prompts arrive first, then a short request: its time to first
    token stays that of a request alone. Before, the instance thread tokenized
    each huge prompt in full (seconds each) before it even looked at the next."""
    over_bound = [_text(1_500_000, seed=s) for s in range(3)]   # refused by counting characters
    long_ones = [_text(400_000, seed=10 + s) for s in range(2)]  # tokenized (off the instance thread), too long

    async def body():
        client = TritonBackendClient(host.grpc_url)
        try:
            alone = await _ttft(client, "alone")
            huge = [asyncio.create_task(_outcome(client, GenerateRequest(f"huge{i}", p, {"max_tokens": 4})))
                    for i, p in enumerate(over_bound + long_ones)]
            await asyncio.sleep(0.2)  # all of them reached the host first
            beside = await _ttft(client, "beside")
            return alone, beside, await asyncio.gather(*huge)
        finally:
            await client.close()

    _wait_idle(host)  # nothing left over from another test slows the reference down
    alone, beside, outcomes = asyncio.run(body())
    assert all(isinstance(o, BackendRejected) and o.kind is ErrorKind.CONTEXT_LENGTH for o in outcomes), outcomes
    assert beside < max(1.0, 10 * alone), (alone, beside)


def _wait_idle(host, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while host.metric("kvserve:num_requests_running") or host.metric("kvserve:num_requests_waiting"):
        assert time.monotonic() < deadline, "the engine never went idle"
        time.sleep(0.2)


async def _ttft(client: TritonBackendClient, rid: str) -> float:
    start = time.perf_counter()
    delta = await _first(client, GenerateRequest(rid, "Once upon a time", {"max_tokens": 1, "temperature": 0}))
    assert delta is not None
    return time.perf_counter() - start


async def _outcome(client: TritonBackendClient, req: GenerateRequest):
    try:
        return [d async for d in client.generate(req)]
    except BackendRejected as exc:
        return exc
