"""AsyncEngine: the LLMEngine on its own thread, fed through a thread-safe inbox.

Callers on any thread add requests with a callback (model.py). Adds and aborts are applied by the engine thread
between steps, so an abort frees the request's blocks before the next step.

A request is admitted (`admission.admit`: tokenized and checked) before it
reaches the engine thread: a short text on the caller's thread, a long one
(megabytes take seconds) on the tokenizer pool, so the caller (Triton's
instance thread, which admits every other request) is never held up by it. A
request counts as pending from `add_request` until it enters the engine, and
an abort that comes in meanwhile wins: the request is dropped where it stands
(before tokenizing, while its grammar compiles, or as it reaches the engine
thread) and ends with finish_reason "abort", so no abort can come too early
and leave a request running with nobody listening.
A constrained request (structured outputs) is compiled on the grammar pool
before it reaches the engine thread: the thread parks it until its grammar is
ready, refuses it with a 400 naming the field when it does not compile or takes
longer than the time bound, and keeps stepping everyone else meanwhile.
Work on the engine's own state (reset_prefix_cache) is queued the same way and runs between
two steps, on the engine thread; the caller waits for its answer.
If a forward pass fails, every in-flight request ends with an error output and
the engine keeps serving new requests (it does not exit); `healthy()` is False
for FAULT_UNHEALTHY_S after each failure, so readiness probes see the fault.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from concurrent.futures import Future, ThreadPoolExecutor

from kvserve.backend.engine.admission import AdmittedPrompt, admit, precheck
from kvserve.backend.engine.config import EngineConfig
from kvserve.backend.engine.engine import LLMEngine
from kvserve.backend.engine.outputs import CompletionOutput, EngineStats, RequestOutput
from kvserve.backend.engine.sampling_params import SamplingParams
from kvserve.backend.engine.stop_matcher import stop_automaton
from kvserve.backend.lora import LoRAError, LoRARequest
from kvserve.backend.structured import CompileJob
from kvserve.backend.worker import WorkerLost
from kvserve.observability.thread_names import name_this_thread
from kvserve.seam.error_wire import ErrorKind, RequestError, invalid
from kvserve.seam.tokenizer import LONG_TEXT_CHARS

log = logging.getLogger("kvserve.engine")

OutputCallback = Callable[[RequestOutput], None]
# How long readiness stays false after a failed step (each failure restarts it):
# long enough for probes and load balancers to notice, short enough that a
# one-off fault does not take the replica out for long.
FAULT_UNHEALTHY_S = 3.0
# After each step (and each batch of adds and aborts), on the engine thread:
# (the engine's stats now, the outputs just delivered, when the step started).
StepListener = Callable[[EngineStats, list[RequestOutput], float], None]
# Long prompts are tokenized here, a few at a time; `tokenizers` drops the GIL for them.
TOKENIZER_THREADS = 2


class EngineOverloaded(RuntimeError):
    """The waiting queue is full: the caller should answer 503 with Retry-After."""
    kind = ErrorKind.OVERLOADED


class EngineClosed(RuntimeError):
    kind = ErrorKind.SHUTDOWN


@dataclass(slots=True)
class _Add:
    request_id: str
    prompt: AdmittedPrompt | None  # None: dropped before it was admitted (aborted, or `error`)
    params: SamplingParams
    callback: OutputCallback
    traceparent: str | None
    arrival: float
    grammar: CompileJob | None = None
    error: RequestError | None = None  # admission refused it (after add_request had returned)
    lora: LoRARequest | None = None

    @property
    def prompt_ids(self) -> list[int]:
        return self.prompt.token_ids if self.prompt is not None else []


@dataclass(slots=True)
class _Abort:
    request_id: str


@dataclass(slots=True)
class _OnEngine:
    """Work on the engine's state, run by the engine thread between two steps."""
    work: Callable[[LLMEngine], object]
    answer: Future


class _Wake:
    """A grammar finished compiling: the engine thread looks at its parked requests."""


_WAKE = _Wake()


class AsyncEngine:
    def __init__(self, config: EngineConfig, step_listeners: list[StepListener] | None = None) -> None:
        self.config = config
        self._inbox: queue.SimpleQueue[_Add | _Abort | _OnEngine | _Wake | None] = queue.SimpleQueue()
        self._compiling: dict[str, _Add] = {}  # engine thread: requests waiting for their grammar
        self._callbacks: dict[str, OutputCallback] = {}
        # Requests added but not yet in the engine -> aborted meanwhile. Under _lock: any
        # thread adds and aborts, the engine thread takes them out as they enter.
        self._pending: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._tokenize_pool = ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="kvserve-tokenize")
        self.step_listeners = list(step_listeners or [])
        self.last_error: str | None = None
        self._unhealthy_until = 0.0  # time.monotonic() until which healthy() is False
        self._closed = False
        # Called on the engine thread after it stopped for good (a lost tensor-parallel worker).
        self.on_fatal: Callable[[BaseException], None] | None = None
        self._start_error: BaseException | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), name="kvserve-engine", daemon=True)
        self._thread.start()
        started.wait()
        if self._start_error is not None:
            raise self._start_error

    def _run(self, started: threading.Event) -> None:
        # The engine is built on the thread that runs it. torch's CPU ops run on an
        # OpenMP thread team per calling thread; a second team (the loading thread's)
        # makes libgomp count more OpenMP threads than cores, and then it stops
        # spinning between parallel regions: every region puts its workers to
        # sleep and wakes them again (measured: ~30k sleeps per 20 s of serving,
        # and steps ~30 % slower than the same engine on one thread).
        name_this_thread()
        try:
            self.engine = LLMEngine(self.config)
            self.engine.grammars.on_done = lambda: self._inbox.put(_WAKE)
            self._stats = self.engine.stats()
        except BaseException as exc:
            self._start_error = exc
            return
        finally:
            started.set()
        self._loop()

    # ---- any thread ------------------------------------------------------------------------
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def healthy(self) -> bool:
        """False while shutting down, after the engine thread died, and for
        FAULT_UNHEALTHY_S after a failed step. Cheap: readiness probes call it."""
        return not self._closed and self._thread.is_alive() and time.monotonic() >= self._unhealthy_until

    def stats(self) -> EngineStats:
        """The engine's stats as of its last step (any thread)."""
        with self._lock:
            return self._stats

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    callback: OutputCallback, traceparent: str | None = None, arrival: float | None = None,
                    lora_request: LoRARequest | None = None) -> None:
        """Admit and queue; outputs reach `callback` on the engine thread.

        Raises RequestError (a ValueError naming the field) for what it finds now: the
        cheap checks, and all of them for a short prompt. A long text prompt is tokenized
        on the pool, and what its admission finds reaches `callback` as an error output.
        `arrival` (time.time(), default now) starts the request's `timeout`.
        `lora_request`: the adapter it runs with (registered: resolve_lora); LoRAError if it is not
        (or LoRA is off). One unloaded meanwhile ends the request with a not_found error output."""
        if self._closed or not self._thread.is_alive():
            raise EngineClosed("the engine is shutting down")
        if lora_request is not None and self.engine.resolve_lora(lora_request.lora_name) != lora_request:
            raise LoRAError(f"adapter {lora_request.lora_name!r} is not loaded", not_found=True)
        arrival = time.time() if arrival is None else arrival
        limits = self.engine.limits
        precheck(prompt, params, limits)
        if params.stop:
            stop_automaton(tuple(params.stop))  # built (~0.1 s at most) here, then cached: not on the engine thread
        limit = self.config.max_waiting_requests
        with self._lock:
            if limit is not None and self._stats.num_requests_waiting + len(self._pending) >= limit:
                raise EngineOverloaded(f"the waiting queue is full ({limit} requests)")
            if request_id in self._pending:
                raise invalid("request_id", "a request with this id is already in flight")
            self._pending[request_id] = False
        item = _Add(request_id, None, params, callback, traceparent, arrival, lora=lora_request)
        long_prompt = isinstance(prompt, str) and len(prompt) > LONG_TEXT_CHARS
        if long_prompt or len(params.prediction or "") > LONG_TEXT_CHARS:  # not on the caller's thread
            self._tokenize_pool.submit(self._admit, item, prompt)
            return
        try:
            item.prompt = admit(prompt, params, limits, self.engine.tokenizer.encode)
        except BaseException:
            with self._lock:
                self._pending.pop(request_id, None)
            raise
        self._queue(item)

    # ---- LoRA adapters (any thread: the registry has its own lock; files are read on the caller's)
    def add_lora(self, lora: LoRARequest) -> None:
        """Read, check and register an adapter (LoRAError if bad); the same name and path again is a no-op."""
        self.engine.add_lora(lora)

    def remove_lora(self, lora_name: str) -> None:
        """LoRAError(not_found) if unknown; requests already running with it finish with it."""
        self.engine.remove_lora(lora_name)

    def list_loras(self) -> list[LoRARequest]:
        return self.engine.list_loras()

    def resolve_lora(self, lora_name: str) -> LoRARequest:
        """LoRAError(not_found) if unknown."""
        return self.engine.resolve_lora(lora_name)

    def _admit(self, item: _Add, prompt: str | list[int]) -> None:
        """On the tokenizer pool: admit a long prompt (or prediction), unless it was aborted while it waited."""
        try:
            with self._lock:
                aborted = self._pending.get(item.request_id, True)
            if not aborted:
                item.prompt = admit(prompt, item.params, self.engine.limits, self.engine.tokenizer.encode)
        except RequestError as exc:
            item.error = exc
        except Exception as exc:
            log.error("admitting request %s failed (%s)", item.request_id, type(exc).__name__)
            log.debug("admission failure", exc_info=True)
            item.error = RequestError("internal error: the request could not be added", None, ErrorKind.INTERNAL)
        self._queue(item)

    def _queue(self, item: _Add) -> None:
        if item.prompt is not None and item.params.grammar is not None:
            item.grammar = self.engine.grammars.submit(item.params.grammar)
        self._inbox.put(item)

    def reset_prefix_cache(self, timeout: float = 30.0) -> int:
        """The engine's reset_prefix_cache, between two steps: how many cached blocks it forgot."""
        return self._on_engine(lambda engine: engine.reset_prefix_cache(), timeout)

    def _on_engine(self, work: Callable[[LLMEngine], object], timeout: float):
        if self._closed:
            raise EngineClosed("unavailable: the engine is shutting down")
        answer: Future = Future()
        self._inbox.put(_OnEngine(work, answer))
        return answer.result(timeout)

    def abort(self, request_id: str) -> None:
        """Abort a request, wherever it is: an abort before the request reached the engine wins."""
        with self._lock:
            if request_id in self._pending:
                self._pending[request_id] = True
        self._inbox.put(_Abort(request_id))

    def shutdown(self, timeout: float = 10.0) -> None:
        self._closed = True
        self._tokenize_pool.shutdown(wait=False)
        self._inbox.put(None)
        self._thread.join(timeout)
        if hasattr(self, "engine"):
            self.engine.grammars.shutdown()
            self.engine.runner.close()  # tensor-parallel workers, if any, stop with the engine

    # ---- engine thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            block = not self.engine.has_unfinished()
            if not self._drain(block):
                break
            if self._compiling:
                self._admit_compiled()
            if not self.engine.has_unfinished():
                if self._lost_a_worker_while_idle():
                    break
                continue
            started = time.time()
            try:
                outputs = self.engine.step()
            except WorkerLost as exc:  # a rank is gone: this engine cannot step again
                self._stop_after_lost_worker(exc, started)
                break
            except Exception as exc:  # a fault in the forward pass must not kill the server
                self._unhealthy_until = float("inf")  # not ready while the fault is handled
                # No traceback at error level: logs must not carry file paths (or
                # anything of a prompt an exception message might quote); the
                # traceback is there for debug logging.
                log.error("engine step failed (%s); failing in-flight requests", type(exc).__name__)
                log.debug("engine step failure", exc_info=True)
                self.last_error = f"{type(exc).__name__}: {exc}"
                outputs = self.engine.recover_from_fault("internal error: the engine step failed")
                self._unhealthy_until = time.monotonic() + FAULT_UNHEALTHY_S
            self._deliver(outputs, started)
        waiting = list(self._compiling.values())
        self._compiling.clear()
        while True:  # adds that were still on their way in
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Add):
                waiting.append(item)
            elif isinstance(item, _OnEngine):
                item.answer.set_exception(EngineClosed("unavailable: the engine is shutting down"))
        for item in waiting:
            self._reject(item, "unavailable: the engine is shutting down", ErrorKind.SHUTDOWN)
        for rid in list(self.engine.groups):
            out = self.engine.fail(rid, "unavailable: the engine is shutting down", ErrorKind.SHUTDOWN)
            if out is not None:
                self._deliver([out], time.time())

    def _lost_a_worker_while_idle(self) -> bool:
        try:
            self.engine.runner.check_workers()
        except WorkerLost as exc:
            self._stop_after_lost_worker(exc, time.time())
            return True
        return False

    def _stop_after_lost_worker(self, exc: WorkerLost, started: float) -> None:
        """Tensor or pipeline parallelism lost a rank (it died, or hung past the bound): every in-flight request
        ends with an error, the other ranks are killed, the engine reports not ready for good and
        `on_fatal` (the Triton model's: the process exits non-zero) lets a supervisor restart it."""
        self._closed = True
        self._unhealthy_until = float("inf")
        self.last_error = f"{type(exc).__name__}: {exc}"
        log.critical("engine stopped: %s", exc)
        outs = [o for rid in list(self.engine.groups)
                if (o := self.engine.fail(rid, "internal error: a parallel worker (tensor or pipeline) was lost; "
                                          "the engine stopped")) is not None]
        self.engine.runner.close(graceful=False)  # before the errors leave: no rank outlives them
        if self.on_fatal is not None:
            self.on_fatal(exc)
        self._deliver(outs, started)

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
            if isinstance(item, _Wake):
                continue
            if isinstance(item, _OnEngine):
                try:
                    item.answer.set_result(item.work(self.engine))
                except Exception as exc:  # the caller gets it; the engine thread goes on
                    item.answer.set_exception(exc)
                continue
            if isinstance(item, _Abort):
                parked = self._compiling.pop(item.request_id, None)
                if parked is not None:  # aborted while its grammar compiled: it never reached the engine
                    self._add(parked)
                    continue
                try:
                    out = self.engine.abort(item.request_id)
                except Exception as exc:  # never let one bad abort stop the engine thread
                    log.error("abort of %s failed (%s)", item.request_id, type(exc).__name__)
                    log.debug("abort failure", exc_info=True)
                    continue
                if out is not None:
                    outputs.append(out)
                continue
            if item.grammar is not None and not item.grammar.done() and not self._aborted(item.request_id):
                self._compiling[item.request_id] = item
                continue
            self._add(item)
        self._deliver(outputs, time.time())
        return True

    def _admit_compiled(self) -> None:
        """Parked requests whose grammar is ready join the engine; those past the bound are refused."""
        now = time.monotonic()
        for rid, item in list(self._compiling.items()):
            job = item.grammar
            if job.done():
                del self._compiling[rid]
                self._add(item)
            elif job.expired(now):
                del self._compiling[rid]
                log.warning("grammar of request %s did not compile within %.1f s", rid,
                            self.engine.grammars.timeout_s)
                self._reject(item, f"structured_outputs: the {job.spec.kind} constraint did not compile "
                                   f"within {self.engine.grammars.timeout_s:g} s", ErrorKind.INVALID,
                             "structured_outputs")

    def _aborted(self, request_id: str) -> bool:
        with self._lock:
            return self._pending.get(request_id, False)

    def _add(self, item: _Add) -> None:
        """The request enters the engine, unless it was aborted or refused on its way here."""
        with self._lock:
            aborted = self._pending.pop(item.request_id, False)
        if aborted:
            self._drop(item)
            return
        if item.error is not None:
            self._reject(item, str(item.error), item.error.kind, item.error.param)
            return
        try:
            grammar = item.grammar.result() if item.grammar is not None else None
            self.engine.add_request(item.request_id, item.prompt, item.params, item.arrival,
                                    item.traceparent, compiled_grammar=grammar, lora_request=item.lora)
            self._callbacks[item.request_id] = item.callback
        except ValueError as exc:
            self._reject(item, str(exc), getattr(exc, "kind", ErrorKind.INVALID), getattr(exc, "param", None))
        except Exception as exc:  # anything else must cost this request only, not the engine thread
            log.error("adding request %s failed (%s)", item.request_id, type(exc).__name__)
            log.debug("add_request failure", exc_info=True)
            self._reject(item, "internal error: the request could not be added", ErrorKind.INTERNAL)

    def _drop(self, item: _Add) -> None:
        """An abort came before the request reached the engine: it ends here, never run."""
        if self.config.debug.log_scheduling:
            log.info("request %s ended (abort): never scheduled", item.request_id)
        choices = [CompletionOutput(i, finish_reason="abort") for i in range(item.params.n)]
        try:
            item.callback(RequestOutput(item.request_id, item.prompt_ids, choices, finished=True))
        except Exception:
            log.error("output callback failed for request %s", item.request_id)

    def _reject(self, item: _Add, message: str, kind: ErrorKind, param: str | None = None) -> None:
        with self._lock:
            self._pending.pop(item.request_id, None)
        try:
            item.callback(RequestOutput(item.request_id, item.prompt_ids, [], finished=True, error=message,
                                        error_kind=kind, error_param=param))
        except Exception:
            log.error("output callback failed for request %s", item.request_id)

    def _deliver(self, outputs: list[RequestOutput], started: float) -> None:
        for out in outputs:
            cb = self._callbacks.pop(out.request_id, None) if out.finished else self._callbacks.get(out.request_id)
            if cb is None:
                continue
            try:
                cb(out)
            except Exception as exc:  # one broken consumer must not stop the others
                log.error("output callback failed for request %s (%s)", out.request_id, type(exc).__name__)
                log.debug("output callback failure", exc_info=True)
        stats = self.engine.stats()
        with self._lock:
            self._stats = stats
        for listener in self.step_listeners:
            try:
                listener(stats, outputs, started)
            except Exception as exc:
                log.error("step listener failed (%s)", type(exc).__name__)
                log.debug("step listener failure", exc_info=True)
