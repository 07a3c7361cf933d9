"""Several backends behind one `BackendClient`: how a deployment grows past one
machine (`kvserve serve --triton-url A --triton-url B`).

Each request goes to the ready replica with the fewest requests in flight from
this gateway. That is cheap, needs no coordination, and evens out long and
short generations better than round-robin.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Sequence

from kvserve.frontend.metrics_merge import merge_exposition
from kvserve.frontend.protocol import BackendClient, BackendUnavailable, ChoiceDelta, GenerateRequest


class ReplicaSet:
    def __init__(self, replicas: Sequence[BackendClient]) -> None:
        if not replicas:
            raise ValueError("ReplicaSet needs at least one backend")
        self._replicas = list(replicas)
        self._in_flight = [0] * len(replicas)
        self._healthy = [True] * len(replicas)  # refreshed by ready()
        self.name = ",".join(r.name for r in replicas)

    def _pick(self) -> int:
        candidates = [i for i, ok in enumerate(self._healthy) if ok] or list(range(len(self._replicas)))
        return min(candidates, key=lambda i: self._in_flight[i])

    async def generate(self, request: GenerateRequest) -> AsyncIterator[ChoiceDelta]:
        i = self._pick()
        self._in_flight[i] += 1
        stream = self._replicas[i].generate(request)
        try:
            async for delta in stream:
                yield delta
        except BackendUnavailable:
            self._healthy[i] = False  # stop routing there until ready() says otherwise
            raise
        finally:
            self._in_flight[i] -= 1
            await stream.aclose()  # type: ignore[attr-defined]

    async def ready(self) -> bool:
        states = await asyncio.gather(*(r.ready() for r in self._replicas))
        self._healthy = list(states)
        return any(states)

    async def metrics_text(self) -> str:
        texts = await asyncio.gather(*(r.metrics_text() for r in self._replicas))
        if len(texts) == 1:
            return texts[0]
        return merge_exposition({r.name: t for r, t in zip(self._replicas, texts) if t})

    async def close(self) -> None:
        await asyncio.gather(*(r.close() for r in self._replicas), return_exceptions=True)
