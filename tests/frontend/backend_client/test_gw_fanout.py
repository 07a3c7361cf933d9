"""Fanout's bound on what a slow consumer leaves untaken (the unit under test_slow_clients.py)."""
from __future__ import annotations

import asyncio

import pytest

from kvserve.frontend.backend_client.fanout import ConsumerTooSlow, Fanout, delta_size
from kvserve.frontend.backend_client.protocol import ChoiceDelta, GenerateRequest


class EndlessBackend:
    name = "endless"

    def __init__(self) -> None:
        self.closed: list[str] = []

    async def generate(self, request: GenerateRequest):
        try:
            while True:
                yield ChoiceDelta(index=0, text="word ", token_ids=[1])
                await asyncio.sleep(0)
        finally:
            self.closed.append(request.request_id)


def _requests(n: int) -> list[GenerateRequest]:
    return [GenerateRequest(request_id=f"r{i}", prompt="x", sampling={}) for i in range(n)]


def test_a_consumer_that_stops_taking_cancels_every_request_once() -> None:
    async def run() -> None:
        backend, calls = EndlessBackend(), []
        async with Fanout(backend, _requests(3), max_buffered_bytes=10_000, on_overflow=lambda: calls.append(1)) as fan:
            for _ in range(200):  # the consumer is "blocked on its socket": it takes nothing
                await asyncio.sleep(0)
                if fan.overflowed:
                    break
            assert fan.overflowed and calls == [1]
            await asyncio.sleep(0.01)
            assert sorted(backend.closed) == ["r0", "r1", "r2"]  # every backend request cancelled
            with pytest.raises(ConsumerTooSlow):
                async for _ in fan:
                    pass
    asyncio.run(run())


def test_a_consumer_that_keeps_up_is_never_cut_off() -> None:
    async def run() -> None:
        backend = EndlessBackend()
        cap = 50 * delta_size(ChoiceDelta(index=0, text="word ", token_ids=[1]))
        async with Fanout(backend, _requests(2), max_buffered_bytes=cap) as fan:
            taken = 0
            async for _ in fan:
                taken += 1
                if taken == 5000:
                    break
            assert not fan.overflowed
    asyncio.run(run())
