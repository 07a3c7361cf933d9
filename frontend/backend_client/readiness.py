"""Whether the backend is ready, asked at most once a second for a burst of requests."""
from __future__ import annotations

import asyncio
import time

from kvserve.frontend.backend_client.protocol import BackendClient


class ReadinessCache:
    """Generation routes answer 503 while the backend is not ready, without a
    gRPC round trip per request: a positive answer is trusted for a second, a
    negative one re-checked sooner so recovery is seen quickly."""

    def __init__(self, backend: BackendClient, ok_ttl: float = 1.0, bad_ttl: float = 0.2) -> None:
        self._backend = backend
        self._ttl = (bad_ttl, ok_ttl)
        self._value = False
        self._expires = 0.0
        self._lock = asyncio.Lock()

    async def ready(self) -> bool:
        if time.monotonic() < self._expires:
            return self._value
        async with self._lock:  # one probe for a burst of requests
            if time.monotonic() >= self._expires:
                self._value = await self._backend.ready()
                self._expires = time.monotonic() + self._ttl[self._value]
        return self._value

    def invalidate(self) -> None:
        self._expires = 0.0
