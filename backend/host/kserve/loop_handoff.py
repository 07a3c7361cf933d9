"""Hand callbacks from model threads to the event loop, one wake-up per burst.

A decoupled model sends one response per request per engine step, from its own
thread; `call_soon_threadsafe` per response costs a self-pipe write and an
event-loop wake-up each. Here callbacks queue up and the loop is woken only
when it is not already due to drain them, so a step's worth of responses for
every stream is handed over in one go.

The wake-up itself keeps the GIL (Linux): an 8-byte write to a non-blocking
eventfd, called through ctypes.PyDLL, which does not release the GIL around
the call as a socket send does. Released, the GIL goes to the engine thread
(its Python between two torch ops), and the model thread that woke the loop
waits to take it back: at batch 1, one extra GIL handover and two futex sleeps
per streamed token, on both threads. The loop reads the eventfd the same way.
Elsewhere (or without os.eventfd) it falls back on call_soon_threadsafe.
"""
from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import threading
import weakref
from collections import deque
from typing import Any, Callable

_BY_LOOP: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopHandoff]" = weakref.WeakKeyDictionary()
_REGISTRY_LOCK = threading.Lock()
_LOG = logging.getLogger("kvserve.host")


def _gil_keeping_libc() -> Any | None:
    if not hasattr(os, "eventfd"):
        return None
    try:
        libc = ctypes.PyDLL(None)  # PyDLL: the call keeps the GIL (the fd never blocks)
        for name in ("write", "read"):
            fn = getattr(libc, name)
            fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
            fn.restype = ctypes.c_ssize_t
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _gil_keeping_libc()
_ONE = ctypes.c_uint64(1)


class LoopHandoff:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        """Made on the loop's thread (add_reader is not thread-safe)."""
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._wake_scheduled = False
        self._efd: int | None = None
        if _LIBC is not None:
            try:
                self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                loop.add_reader(self._efd, self._drain)
            except (OSError, NotImplementedError):  # a loop without add_reader (e.g. Windows' proactor)
                if self._efd is not None:
                    os.close(self._efd)
                self._efd = None
            else:
                weakref.finalize(self, os.close, self._efd)
        self._counter = ctypes.c_uint64(0)

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run fn(*args) on the loop soon; raises RuntimeError once the loop is closed."""
        if self._efd is not None and self._loop.is_closed():
            raise RuntimeError("Event loop is closed")
        with self._lock:
            self._pending.append((fn, args))
            if self._wake_scheduled:
                return
            self._wake_scheduled = True
        if self._efd is not None:
            _LIBC.write(self._efd, ctypes.byref(_ONE), 8)  # only fails (EAGAIN) with 2^64 - 1 wake-ups unread
            return
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            with self._lock:
                self._wake_scheduled = False
            raise

    def _drain(self) -> None:
        if self._efd is not None:
            _LIBC.read(self._efd, ctypes.byref(self._counter), 8)  # reset before the swap: no wake-up lost
        with self._lock:
            batch, self._pending = self._pending, deque()
            self._wake_scheduled = False
        for fn, args in batch:
            try:
                fn(*args)
            except Exception:  # as the event loop does for a failing callback: log, go on with the rest
                _LOG.exception("callback handed to the event loop failed")


def handoff_for(loop: asyncio.AbstractEventLoop) -> LoopHandoff:
    """The loop's hand-off; call it on the loop's thread."""
    with _REGISTRY_LOCK:
        handoff = _BY_LOOP.get(loop)
        if handoff is None:
            handoff = _BY_LOOP[loop] = LoopHandoff(loop)
        return handoff
