"""An in-memory replica whose failures the routing tests script."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator

from kvserve.frontend.backend_client.protocol import BackendRejected, BackendUnavailable, ChoiceDelta, GenerateRequest
from kvserve.seam.error_wire import ErrorKind


@dataclass
class ScriptedReplica:
    """Streams `tokens` deltas. `hold` (an Event) delays the first one, as a
    queue in the engine would; `fail_before_first` / `fail_after_first` raise
    BackendUnavailable there; `overloaded` rejects as a full queue does."""

    name: str
    is_ready: bool = True
    tokens: int = 3
    hold: asyncio.Event | None = None
    fail_before_first: bool = False
    fail_after_first: bool = False
    overloaded: bool = False
    seen: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    closed: bool = False
    metrics: str = "# TYPE kvserve:num_requests_running gauge\nkvserve:num_requests_running 1\n"

    async def ready(self) -> bool:
        return self.is_ready

    async def metrics_text(self) -> str:
        return self.metrics

    async def close(self) -> None:
        self.closed = True

    async def describe(self):
        return None

    async def generate(self, request: GenerateRequest) -> AsyncIterator[ChoiceDelta]:
        self.seen.append(request.request_id)
        done = False
        try:
            if self.overloaded:
                raise BackendRejected("unavailable: the waiting queue is full", kind=ErrorKind.OVERLOADED)
            if self.hold is not None:
                await self.hold.wait()
            if self.fail_before_first:
                raise BackendUnavailable(f"backend {self.name}: UNAVAILABLE")
            for i in range(self.tokens):
                yield ChoiceDelta(index=0, text=f"{self.name}{i}", completion_tokens=i + 1,
                                  finish_reason="length" if i == self.tokens - 1 else None)
                if self.fail_after_first:
                    raise BackendUnavailable(f"backend {self.name}: UNAVAILABLE")
                await asyncio.sleep(0)
            done = True
        finally:
            if not done:
                self.cancelled.append(request.request_id)


def req(rid: str, prompt: str | list[int] = "x", **sampling) -> GenerateRequest:
    return GenerateRequest(rid, prompt, {"max_tokens": 3, **sampling})


async def drain(stream) -> list[ChoiceDelta]:
    return [d async for d in stream]
