"""One streaming request against /v1/completions or /v1/chat/completions.

Timing follows vllm bench serve: TTFT is taken at the first chunk that carries
content (a chat role-only chunk does not count), ITL is every gap between
consecutive content chunks, and output tokens come from the usage chunk that
`stream_options.include_usage` asks for. E2EL runs until the stream ends.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kvserve.loadtests.bench.bench_request import BenchRequest, RequestRecord
from kvserve.loadtests.bench.sse import LineSplitter, data_payload, parse_payload

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(slots=True)
class EndpointConfig:
    base_url: str
    model: str
    endpoint_type: str = "completions"
    api_key: str | None = None
    ignore_eos: bool = False
    temperature: float = 0.0
    extra_body: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + PATHS[self.endpoint_type]

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def body(self, req: BenchRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": req.expected_output_len,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.endpoint_type == "chat":
            body["messages"] = [{"role": "user", "content": req.prompt}]
            # Newer OpenAI servers read this name; older ones only max_tokens.
            body["max_completion_tokens"] = req.expected_output_len
        else:
            body["prompt"] = req.prompt
        if self.ignore_eos:
            # Not an OpenAI field: vLLM-style servers honour it so every request
            # produces exactly max_tokens, which makes runs comparable.
            body["ignore_eos"] = True
        body.update(self.extra_body)
        return body


async def send_request(
    session: aiohttp.ClientSession, cfg: EndpointConfig, req: BenchRequest, bench_start: float
) -> RequestRecord:
    record = RequestRecord(index=req.index, prompt_tokens=req.prompt_len)
    sent = time.perf_counter()
    record.start = sent - bench_start
    try:
        async with session.post(cfg.url, json=cfg.body(req), headers=cfg.headers()) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300]
                record.error = f"HTTP {resp.status}: {text}"
                return record
            await _consume_stream(resp, record, sent)
    except asyncio.TimeoutError:
        record.error = "timeout"
    except aiohttp.ClientError as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    return record


async def _consume_stream(resp: aiohttp.ClientResponse, record: RequestRecord, sent: float) -> None:
    splitter = LineSplitter()
    last_content: float | None = None
    chunks = 0
    finished = False
    async for raw in resp.content.iter_any():
        now = time.perf_counter()
        for line in splitter.feed(raw):
            payload = data_payload(line)
            if payload is None:
                continue
            event = parse_payload(payload)
            if event.error:
                record.error = event.error
                return
            if event.done:
                finished = True
                break
            if event.text:
                if last_content is None:
                    record.ttft = now - sent
                else:
                    record.itl.append(now - last_content)
                last_content = now
                chunks += 1
                record.output_chars += len(event.text)
            if event.completion_tokens is not None:
                record.output_tokens = int(event.completion_tokens)
                record.usage_reported = True
            if event.prompt_tokens is not None:
                record.prompt_tokens = int(event.prompt_tokens)
        if finished:
            break
    record.e2el = time.perf_counter() - sent
    if chunks == 0:
        record.error = "stream ended without any content"
        return
    if not record.usage_reported:
        # Server ignored include_usage: a chunk is our best token count.
        record.output_tokens = chunks
    record.success = True
