"""AsyncEngine: the LLMEngine on its own thread, fed through a thread-safe inbox.

Callers on any thread add requests with a callback (model.py) or iterate an
async stream (`generate`). Adds and aborts are applied by the engine thread
between steps, so an abort frees the request's blocks before the next step.
If a forward pass fails, every in-flight request ends with an error output and
the engine keeps serving new requests (it does not exit).
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from kvserve.backend.config import EngineConfig
from kvserve.backend.engine import LLMEngine
from kvserve.backend.outputs import RequestOutput
from kvserve.backend.sampling_params import SamplingParams

log = logging.getLogger("kvserve.engine")

OutputCallback = Callable[[RequestOutput], None]
StepListener = Callable[[LLMEngine, list[RequestOutput], float], None]


class EngineOverloaded(RuntimeError):
    """The waiting queue is full: the caller should answer 503 with Retry-After."""


class EngineClosed(RuntimeError):
    pass


@dataclass(slots=True)
class _Add:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    callback: OutputCallback
    traceparent: str | None
    arrival: float


@dataclass(slots=True)
class _Abort:
    request_id: str


class AsyncEngine:
    def __init__(self, config: EngineConfig, step_listeners: list[StepListener] | None = None) -> None:
        self.engine = LLMEngine(config)
        self.config = config
        self._inbox: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self._callbacks: dict[str, OutputCallback] = {}
        self._pending_adds = 0
        self._lock = threading.Lock()
        self._stats = self.engine.stats()
        self.step_listeners = list(step_listeners or [])
        self.last_error: str | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="kvserve-engine", daemon=True)
        self._thread.start()

    # ---- any thread ------------------------------------------------------------------------
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def stats(self) -> dict[str, float]:
        with self._lock:
            return dict(self._stats)

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    callback: OutputCallback, traceparent: str | None = None) -> None:
        """Validate now (ValueError names the field) and queue; outputs reach `callback` on the engine thread."""
        if self._closed:
            raise EngineClosed("the engine is shutting down")
        ids = self.engine.validate_prompt(prompt, params)
        limit = self.config.max_waiting_requests
        with self._lock:
            if limit is not None and self._stats["num_requests_waiting"] + self._pending_adds >= limit:
                raise EngineOverloaded(f"the waiting queue is full ({limit} requests)")
            self._pending_adds += 1
        self._inbox.put(_Add(request_id, ids, params, callback, traceparent, time.time()))

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))

    async def generate(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                       traceparent: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream of deltas; leaving the loop early (or cancellation) aborts the request."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.add_request(request_id, prompt, params, lambda out: loop.call_soon_threadsafe(q.put_nowait, out),
                         traceparent)
        finished = False
        try:
            while not finished:
                out = await q.get()
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.abort(request_id)

    def shutdown(self, timeout: float = 10.0) -> None:
        self._closed = True
        self._inbox.put(None)
        self._thread.join(timeout)

    # ---- engine thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            block = not self.engine.has_unfinished()
            if not self._drain(block):
                break
            if not self.engine.has_unfinished():
                continue
            started = time.time()
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a fault in the forward pass must not kill the server
                log.exception("engine step failed; failing in-flight requests")
                self.last_error = f"{type(exc).__name__}: {exc}"
                outputs = self.engine.recover_from_fault("internal error: the engine step failed")
            self._deliver(outputs, started)
        for rid in list(self.engine.groups):
            out = self.engine.fail(rid, "unavailable: the engine is shutting down", "shutdown")
            if out is not None:
                self._deliver([out], time.time())

    def _drain(self, block: bool) -> bool:
        """Apply queued adds/aborts; False when shutdown was requested."""
        outputs: list[RequestOutput] = []
        while True:
            try:
                item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
            except queue.Empty:
                break
            block = False
            if item is None:
                return False
            if isinstance(item, _Abort):
                try:
                    out = self.engine.abort(item.request_id)
                except Exception:  # never let one bad abort stop the engine thread
                    log.exception("abort of %s failed", item.request_id)
                    continue
                if out is not None:
                    outputs.append(out)
                continue
            with self._lock:
                self._pending_adds -= 1
            try:
                self.engine.add_request(item.request_id, item.prompt_ids, item.params, item.arrival,
                                        item.traceparent)
                self._callbacks[item.request_id] = item.callback
            except ValueError as exc:
                item.callback(RequestOutput(item.request_id, item.prompt_ids, [], finished=True, error=str(exc),
                                            error_kind="invalid"))
        self._deliver(outputs, time.time())
        return True

    def _deliver(self, outputs: list[RequestOutput], started: float) -> None:
        for out in outputs:
            cb = self._callbacks.pop(out.request_id, None) if out.finished else self._callbacks.get(out.request_id)
            if cb is None:
                continue
            try:
                cb(out)
            except Exception:  # one broken consumer must not stop the others
                log.exception("output callback failed for request %s", out.request_id)
        stats = self.engine.stats()
        with self._lock:
            self._stats = stats
        for listener in self.step_listeners:
            try:
                listener(self.engine, outputs, started)
            except Exception:
                log.exception("step listener failed")
