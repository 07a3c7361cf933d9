"""Graceful shutdown of the gateway (SIGTERM/SIGINT).

1. At once: `/health` and new generation requests answer 503 (Retry-After),
   so a load balancer takes the replica out while the socket stays open.
2. In-flight requests run on for up to `--shutdown-timeout` seconds.
3. Past it (or on a second signal), each request still running ends with an
   error: an SSE error event then `data: [DONE]` for streams, a 503 error
   object otherwise; their Triton requests are cancelled, freeing their blocks.
Then the caller closes the HTTP server and stops the embedded host.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from kvserve.frontend.backend_client import ShuttingDown
from kvserve.frontend.http.gateway import Gateway

log = logging.getLogger("kvserve.frontend.serve")
_POLL_S = 0.05
_ABORT_GRACE_S = 2.0  # for the aborted handlers to write their error events


async def _wait_idle(gateway: Gateway, seconds: float, stop_early: Callable[[], bool]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while gateway.active and loop.time() < deadline and not stop_early():
        await asyncio.sleep(_POLL_S)


async def drain_gateway(gateway: Gateway, timeout_s: float, force: asyncio.Event,
                backend_alive: Callable[[], bool] = lambda: True) -> int:
    """Returns how many requests had to be aborted at the deadline."""
    gateway.draining = True
    if gateway.active:
        log.info("shutting down: waiting up to %.0f s for %d in-flight request(s)", timeout_s, len(gateway.active))
    await _wait_idle(gateway, timeout_s, lambda: force.is_set() or not backend_alive())
    left = list(gateway.active)
    if left:
        log.warning("shutting down: ending %d request(s) still running with an error", len(left))
        for fan in left:
            fan.abort(ShuttingDown("the server is shutting down"))
        await _wait_idle(gateway, _ABORT_GRACE_S, lambda: False)
    return len(left)
