"""A stream whose client stopped reading is cancelled after --write-timeout seconds without progress.

The unread-output cap (fanout.py) bounds the gateway's memory, but not time: a request whose
output stays under the cap, or one still generating slowly, held its KV blocks (and once its
engine side ended, its handler, blocked on a full socket) for as long as the client kept the
connection open without reading, which is forever for a stuck client.

Progress is bytes leaving the transport's buffer for the socket, so a slow reader that takes a
little at a time is never cut off; only one that takes nothing for the whole timeout is. It is
checked on a timer (a quarter of the timeout), not per write: frames cost nothing extra.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

log = logging.getLogger("kvserve.gateway")


class WriteStallWatch:
    def __init__(self, transport: asyncio.WriteTransport, written: Callable[[], int], timeout: float,
                 name: str) -> None:
        self._transport = transport
        self._written = written  # bytes this stream handed to the transport so far
        self._timeout = timeout
        self._name = name
        self._loop = asyncio.get_running_loop()
        self._last_sent = -1
        self._last_progress = self._loop.time()
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(timeout / 4, self._check)

    def _check(self) -> None:
        self._handle = None
        if self._transport.is_closing():
            return
        pending = self._transport.get_write_buffer_size()
        sent = self._written() - pending
        now = self._loop.time()
        if pending == 0 or sent > self._last_sent:
            self._last_sent, self._last_progress = sent, now
        elif now - self._last_progress >= self._timeout:
            log.warning("stream %s cancelled: the client read nothing for %g s", self._name, self._timeout)
            # A write blocked on the full socket fails now; the handler's ConnectionError path
            # leaves the fanout, which cancels the backend requests (the engine frees their blocks).
            self._transport.abort()
            return
        self._handle = self._loop.call_later(self._timeout / 4, self._check)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
