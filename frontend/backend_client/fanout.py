"""Run the backend requests of one HTTP request (one per prompt) concurrently
and merge their deltas into one ordered-by-arrival stream.

Leaving the `async with` block for any reason (done, error, client gone,
handler cancelled) cancels the pump tasks, which closes each backend stream and
so cancels each Triton request at once.

The pumps never wait for the consumer (a backend stream that is not read would
stall the engine's response path), so what a slow consumer has not taken yet
is bounded instead: past `max_buffered_bytes` the pumps stop, the backend
requests are cancelled (their KV blocks freed) and `on_overflow` runs once,
for the caller to drop its client: a client that stops reading would otherwise
make the gateway hold the engine's whole output.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable, Sequence

from kvserve.frontend.backend_client.protocol import (BackendClient, BackendError, BackendFailed, ChoiceDelta,
                                                      GenerateRequest)

_END = object()


class ConsumerTooSlow(BackendError):
    """The consumer left more than max_buffered_bytes untaken; the requests were cancelled."""


def delta_size(delta: ChoiceDelta) -> int:
    """About the bytes a delta holds in memory: text, token ids, logprob entries (objects of
    two numbers each). An estimate for a bound, not an accounting."""
    size = 64 + 4 * len(delta.text) + 8 * len(delta.token_ids)
    for entry in delta.logprobs or ():
        size += 96 + 64 * len(entry.top_logprobs)
    return size


class Fanout:
    def __init__(self, backend: BackendClient, requests: Sequence[GenerateRequest], *,
                 max_buffered_bytes: int | None = None, on_overflow: Callable[[], None] | None = None) -> None:
        self._backend = backend
        self._requests = list(requests)
        self._queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._open = len(self._requests)
        self._buffer: list[tuple[int, ChoiceDelta]] = []
        self._ended: set[int] = set()
        self._max_buffered = max_buffered_bytes
        self._buffered = 0  # delta_size() of what is queued and not yet taken
        self._on_overflow = on_overflow
        self.overflowed = False

    async def __aenter__(self) -> Fanout:
        self._tasks = [asyncio.create_task(self._pump(i, r)) for i, r in enumerate(self._requests)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def abort(self, exc: BaseException) -> None:
        """End the call now with `exc` (the consumer raises it), e.g. at the
        shutdown deadline; leaving the `async with` then cancels the requests."""
        self._queue.put_nowait((-1, exc))

    async def _pump(self, index: int, request: GenerateRequest) -> None:
        stream = self._backend.generate(request)
        try:
            async for delta in stream:
                self._buffered += delta_size(delta)
                self._queue.put_nowait((index, delta))
                if self._max_buffered is not None and self._buffered > self._max_buffered:
                    self._overflow()
                    return
            self._queue.put_nowait((index, _END))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # handed to the consumer, which turns it into an HTTP error
            self._queue.put_nowait((index, exc))
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    def _overflow(self) -> None:
        if self.overflowed:
            return
        self.overflowed = True
        current = asyncio.current_task()
        for task in self._tasks:  # the other pumps: their backend requests are cancelled too
            if task is not current:
                task.cancel()
        self._queue.put_nowait((-1, ConsumerTooSlow("the client did not read the stream fast enough")))
        if self._on_overflow is not None:
            self._on_overflow()

    async def _next(self) -> tuple[int, ChoiceDelta] | None:
        while self._open:
            index, item = await self._queue.get()
            if isinstance(item, ChoiceDelta):
                self._buffered -= delta_size(item)
            if item is _END:
                self._open -= 1
                self._ended.add(index)
                continue
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, ChoiceDelta)
            if item.finish_reason == "error":
                raise BackendFailed("the engine failed while generating")
            return index, item
        return None

    async def prefetch(self) -> None:
        """Wait until every request produced its first delta or ended.

        The engine validates a request when it receives it, so its errors
        (bad field, prompt too long) arrive first; waiting for them before the
        HTTP status is sent lets them become a proper 400 instead of an error
        event inside a 200 stream.
        """
        pending = set(range(len(self._requests)))
        while pending - self._ended:
            got = await self._next()
            if got is None:
                break
            pending.discard(got[0])
            self._buffer.append(got)

    @property
    def prefetched(self) -> list[tuple[int, ChoiceDelta]]:
        """The deltas prefetch() took and iteration has not yet handed out."""
        return list(self._buffer)

    async def __aiter__(self) -> AsyncIterator[tuple[int, ChoiceDelta]]:
        while self._buffer:
            yield self._buffer.pop(0)
        while True:
            got = await self._next()
            if got is None:
                return
            yield got
