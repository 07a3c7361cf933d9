"""Hand callbacks from model threads to the event loop, one wake-up per burst.

A decoupled model sends one response per request per engine step, from its own
thread; `call_soon_threadsafe` per response costs a self-pipe write and an
event-loop wake-up each. Here callbacks queue up and the loop is woken only
when it is not already due to drain them, so a step's worth of responses for
every stream is handed over in one go.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections import deque
from typing import Any, Callable

_BY_LOOP: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopHandoff]" = weakref.WeakKeyDictionary()
_REGISTRY_LOCK = threading.Lock()
_LOG = logging.getLogger("kvserve.host")


class LoopHandoff:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._wake_scheduled = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run fn(*args) on the loop soon; raises RuntimeError once the loop is closed."""
        with self._lock:
            self._pending.append((fn, args))
            if self._wake_scheduled:
                return
            self._wake_scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            with self._lock:
                self._wake_scheduled = False
            raise

    def _drain(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, deque()
            self._wake_scheduled = False
        for fn, args in batch:
            try:
                fn(*args)
            except Exception:  # as the event loop does for a failing callback: log, go on with the rest
                _LOG.exception("callback handed to the event loop failed")


def handoff_for(loop: asyncio.AbstractEventLoop) -> LoopHandoff:
    with _REGISTRY_LOCK:
        handoff = _BY_LOOP.get(loop)
        if handoff is None:
            handoff = _BY_LOOP[loop] = LoopHandoff(loop)
        return handoff
