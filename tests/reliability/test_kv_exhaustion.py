"""KV exhaustion: a load that needs about four times the KV budget. No request
fails or hangs; the scheduler preempts (and recomputes) instead; every greedy
output equals the same request run alone; all blocks come back afterwards."""
from __future__ import annotations

import asyncio

import pytest

from tests.conftest import tiny_model
from tests.reliability.served import Served, start_served
from tests.reliability.sse_client import new_session, stream
from tests.reliability.test_disconnects import PROMPTS

BLOCK, USABLE_BLOCKS, MAX_TOKENS = 16, 16, 120


@pytest.fixture(scope="module")
def small_kv_server():
    # 17 blocks = the null block + 16 usable blocks of 16 tokens: 256 tokens, one full-length sequence.
    served = start_served(["--model", tiny_model("llama"), "--served-model-name", "tiny",
                           "--num-kv-blocks", str(USABLE_BLOCKS + 1), "--block-size", str(BLOCK),
                           "--max-model-len", str(USABLE_BLOCKS * BLOCK), "--max-num-seqs", "16"])
    try:
        yield served
    finally:
        assert served.stop(timeout=60) == 0


def test_four_times_the_kv_budget_completes_unchanged(small_kv_server: Served) -> None:
    served = small_kv_server
    body = {"model": "tiny", "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    alone = {}
    for p in PROMPTS:
        alone[p] = served.complete(**body, prompt=p)["choices"][0]["text"]
    needed = sum(-(-(served.post("/tokenize", {"prompt": p}).json()["count"] + MAX_TOKENS) // BLOCK) for p in PROMPTS)
    assert needed >= 4 * USABLE_BLOCKS, needed  # the load really is ~4x the budget
    before = served.metrics()["kvserve:num_preemptions_total"]

    async def together():
        async with new_session() as session:
            return await asyncio.wait_for(asyncio.gather(*(
                stream(session, served, "/v1/completions", {**body, "prompt": p,
                                                            "stream_options": {"include_usage": True}})
                for p in PROMPTS)), 120)

    results = asyncio.run(together())
    for p, res in zip(PROMPTS, results):
        assert res.status == 200 and res.done and res.error is None, (res.status, res.body[:200])
        assert res.finish_reasons == ["length"] and res.usage["completion_tokens"] == MAX_TOKENS
        assert res.text == alone[p]
    assert served.metrics()["kvserve:num_preemptions_total"] > before
    assert served.wait_idle(2.0) == (0, 0, 0)
    assert served.get("/health").status == 200
