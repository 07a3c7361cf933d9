"""embed_bench's client loop and command lines, against an in-process fake /v1/embeddings."""
from __future__ import annotations

import asyncio

from aiohttp import web

from kvserve.loadtests.compare.embed_bench import _command, bench_texts, run_point


def test_texts_are_deterministic_and_varied():
    texts = bench_texts(64)
    assert texts == bench_texts(64) and len(set(texts)) == 64
    assert min(len(t.split()) for t in texts) >= 6


def test_closed_loop_sends_every_request_once_at_the_given_concurrency():
    seen, in_flight, peak = [], [0], [0]

    async def embeddings(request: web.Request) -> web.Response:
        body = await request.json()
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        await asyncio.sleep(0.01)
        in_flight[0] -= 1
        seen.append(body["input"])
        return web.json_response({"data": [{"embedding": [0.0], "index": 0, "object": "embedding"}]})

    async def main():
        app = web.Application()
        app.router.add_post("/v1/embeddings", embeddings)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            return await run_point(f"http://127.0.0.1:{port}", "m", ["a", "b", "c"], 4, 20)
        finally:
            await runner.cleanup()

    wall, latencies = asyncio.run(main())
    assert len(latencies) == len(seen) == 20 and peak[0] == 4 and wall > 0
    assert seen.count("a") == 7  # requests cycle through the texts


def test_peers_are_started_on_the_same_folder():
    assert "--embedding-model" in _command("kvserve", "/m", 1, None)
    assert "/m" in _command("naive", "/m", 1, None)
    vllm = _command("vllm", "/m", 1, "/venv/bin/python")
    assert vllm[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"] and "pooling" in vllm
