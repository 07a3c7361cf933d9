"""A small async SSE client over aiohttp that keeps every frame's raw bytes, so
tests can check the wire (strict UTF-8 per frame, error events, `[DONE]`) and
can drop the connection at a chosen point (before the headers, after k frames).
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.reliability.served import Served

CLIENT_TIMEOUT_S = 60.0


@dataclass
class StreamResult:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    frames: list[bytes] = field(default_factory=list)  # raw `data:` payloads, [DONE] excluded
    done: bool = False  # saw `data: [DONE]`
    body: bytes = b""  # the body of a non-200 answer
    dropped: str = ""  # "" | "before-headers" | "mid-stream"

    @property
    def got_headers(self) -> bool:
        return self.status != 0

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(f.decode("utf-8")) for f in self.frames]

    @property
    def error(self) -> dict[str, Any] | None:
        for e in self.events():
            if "error" in e:
                return e["error"]
        return None

    def deltas(self) -> list[str]:
        out = []
        for e in self.events():
            for c in e.get("choices") or []:
                if "text" in c:
                    out.append(c["text"])
                elif c.get("delta", {}).get("content") is not None:
                    out.append(c["delta"]["content"])
        return out

    @property
    def text(self) -> str:
        return "".join(self.deltas())

    @property
    def finish_reasons(self) -> list[str]:
        return [c["finish_reason"] for e in self.events() for c in e.get("choices") or [] if c.get("finish_reason")]

    @property
    def usage(self) -> dict[str, Any] | None:
        found = [e["usage"] for e in self.events() if e.get("usage")]
        return found[-1] if found else None


async def stream(session: aiohttp.ClientSession, served: Served, path: str, body: dict[str, Any], *,
                 key: str | None = "default", drop_after_frames: int | None = None,
                 drop_before_headers_s: float | None = None, timeout: float = CLIENT_TIMEOUT_S) -> StreamResult:
    """POST with stream=true and read the SSE answer.

    drop_after_frames=k closes the connection after k data frames;
    drop_before_headers_s=t closes it after t seconds unless the headers came
    first (the request is then most likely still queued in the engine)."""
    result = StreamResult()
    payload = {**body, "stream": True}

    async def run() -> None:
        async with session.post(served.url + path, json=payload, headers=served.auth(key)) as resp:
            result.status = resp.status
            result.headers = dict(resp.headers)
            if resp.status != 200:
                result.body = await resp.read()
                return
            while True:
                line = await resp.content.readline()
                if not line:
                    return
                if not line.startswith(b"data: "):
                    continue
                data = line[len(b"data: "):].rstrip(b"\r\n")
                if data == b"[DONE]":
                    result.done = True
                    continue
                result.frames.append(data)
                if drop_after_frames is not None and len(result.frames) >= drop_after_frames:
                    result.dropped = "mid-stream"
                    resp.close()  # drop the connection, as a client that went away
                    return

    task = asyncio.create_task(run())
    try:
        if drop_before_headers_s is not None:
            await asyncio.wait({task}, timeout=drop_before_headers_s)
            if not task.done() and not result.got_headers:
                result.dropped = "before-headers"
                task.cancel()  # closes the connection before any byte of the answer
        await asyncio.wait_for(asyncio.shield(task), timeout)
    except asyncio.CancelledError:
        if not result.dropped:
            raise
    finally:
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return result


def new_session() -> aiohttp.ClientSession:
    # No connection limit: hundreds of concurrent streams are the point of some tests.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=CLIENT_TIMEOUT_S))
