"""A small fake OpenAI-compatible SSE server for the benchmark tests.

It runs on its own event loop in a thread because the benchmark under test
calls asyncio.run() itself. Token counting is deliberately uneven (words of
7+ letters cost two tokens, chat adds a template overhead) so the tests can
tell an exact prompt builder from one that merely counts words.
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

from aiohttp import web

MODEL = "fake-model"
CHAT_OVERHEAD = 4  # tokens the fake "chat template" adds


def count_tokens(text: str) -> int:
    return 1 + sum(2 if len(w) >= 7 else 1 for w in text.split())


def count_body(body: dict[str, Any]) -> int:
    if "messages" in body:
        return CHAT_OVERHEAD + sum(count_tokens(m["content"]) for m in body["messages"])
    return count_tokens(body["prompt"])


@dataclass
class FakeServer:
    delay_s: float = 0.004  # between content chunks
    first_delay_s: float = 0.02  # "prefill"
    fail_every: int = 0  # every k-th generation request gets HTTP 500 (0: never)
    stream_error_every: int = 0  # every k-th gets an error event mid-stream
    tokenize: bool = True
    usage: bool = True
    bodies: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)  # Authorization header per generation request
    url: str = ""
    _count: int = 0

    # -- routes -----------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def tokenize_route(self, request: web.Request) -> web.Response:
        if not self.tokenize:
            raise web.HTTPNotFound()
        n = count_body(await request.json())
        return web.json_response({"count": n, "tokens": list(range(n)), "max_model_len": 4096})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._generate(request)
        except ConnectionResetError:  # client went away mid-stream (locust stopping)
            return web.Response(status=499)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.auth.append(request.headers.get("Authorization", ""))
        self._count += 1
        nth = self._count  # fixed now: other requests bump the counter while we stream
        if self.fail_every and nth % self.fail_every == 0:
            return web.json_response({"error": {"message": "injected failure", "type": "server_error"}}, status=500)
        chat = request.path.endswith("/chat/completions")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(obj: Any) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            await resp.write(f"data: {data}\n\n".encode())

        n = int(body["max_tokens"])
        if chat:  # role-only chunk: carries no content, must not start TTFT
            await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        await asyncio.sleep(self.first_delay_s)
        for i in range(n):
            if i:
                await asyncio.sleep(self.delay_s)
            if self.stream_error_every and nth % self.stream_error_every == 0 and i == n // 2:
                await send({"error": {"message": "injected stream error"}})
                return resp
            choice = {"index": 0, "delta": {"content": f" t{i}"}} if chat else {"index": 0, "text": f" t{i}"}
            await send({"object": "chunk", "choices": [choice]})
        end = {"index": 0, "finish_reason": "length", **({"delta": {}} if chat else {"text": ""})}
        await send({"object": "chunk", "choices": [end]})
        if self.usage and body.get("stream_options", {}).get("include_usage"):
            prompt = count_body(body)
            await send({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": n,
                                                 "total_tokens": prompt + n}})
        await send("[DONE]")
        return resp

    # -- lifecycle ----------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/tokenize", self.tokenize_route)
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/v1/chat/completions", self.generate)
        return app

    def serve_in_thread(self) -> Iterator["FakeServer"]:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(self.app(), access_log=None)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.SockSite(runner, sock).start())
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        self.url = f"http://127.0.0.1:{port}"
        try:
            yield self
        finally:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()
