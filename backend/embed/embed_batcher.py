"""Batching for the embed model: many requests' inputs in one packed forward pass.

Why here and not Triton's `dynamic_batching`: the unit worth batching is an
*input* (one text), not a request (which may carry 1 or 2,048 of them), and the
bound that matters is tokens per pass, like the LLM engine's
max_num_batched_tokens. Triton's batcher counts requests, pads each to the
largest batch dimension and knows nothing of token counts; and doing it in the
model behaves the same in tritonserver and in the embedded host.

The policy is the LLM engine's, without a delay: a worker thread runs passes
back to back; each pass takes the waiting inputs in arrival order (a request's
inputs may spread over several passes) up to `max_num_batched_tokens` tokens
and `max_num_seqs` inputs. Whatever arrives during a pass joins the next one,
so under load passes fill by themselves and an idle model answers at once
instead of waiting for a queue delay to expire.

With `num_workers` > 1 (on the CPU), that many workers run passes at once and
split the model's threads between them. On a CPU one pass on N OpenMP threads
meets a barrier after every op, and when the gateway, the gRPC threads or the
client take a core from one of its threads the others wait at the next
barrier; passes side by side on one thread each never wait for each other. A
worker that starts while the queue holds more than its share takes its share
and half the free threads, and another starts beside it on the rest; a pass
that takes the whole queue gets every free thread (the latency of a lone
request), and no worker starts until threads are free again, since more
compute threads than cores would stall that pass at its barriers. The thread
count is OpenMP's per calling thread (torch.set_num_threads in a worker
changes only its own).
"""
from __future__ import annotations

import ctypes
import functools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np
import torch

from kvserve.backend.embed.embedder import Embedder
from kvserve.observability.thread_names import name_this_thread
from kvserve.seam.error_wire import ErrorKind

log = logging.getLogger("kvserve.backend.embed")


def _set_own_threads(n: int) -> None:
    """The calling thread's OpenMP thread count, and no other's. torch.set_num_threads also sets
    the count that every thread started later begins with (an LLM engine loaded next, a test);
    omp_set_num_threads sets the caller's only. torch.get_num_threads() first: torch's
    once-per-thread initialisation would otherwise override it at the first parallel op. (MKL
    keeps its own count: the packed oneDNN linears do not use it.)"""
    torch.get_num_threads()
    omp = _openmp()
    if omp is None:
        torch.set_num_threads(n)
    else:
        omp.omp_set_num_threads(n)


@functools.cache
def _openmp():
    """torch's libgomp (already loaded, found by its soname), or None for another OpenMP runtime."""
    try:
        return ctypes.CDLL("libgomp.so.1")
    except OSError:
        return None


class BatcherOverloaded(Exception):
    pass


class BatcherClosed(Exception):
    pass


@dataclass(slots=True, frozen=True)
class EmbedResult:
    request_id: str
    embeddings: np.ndarray | None  # [n, dim] float32; None on error
    prompt_tokens: list[int]       # per input
    arrival: float                 # time.time() instants
    scheduled: float | None
    finished: float
    num_passes: int
    error: str | None = None
    error_kind: ErrorKind | None = None


@dataclass(slots=True, eq=False)
class EmbedJob:
    request_id: str
    inputs: list[list[int]]
    dimensions: int | None
    normalize: bool | None
    on_done: Callable[[EmbedResult], None]
    traceparent: str | None = None
    arrival: float = field(default_factory=time.time)
    scheduled: float | None = None
    next_input: int = 0  # inputs before it have been handed to a pass
    done: int = 0
    passes: int = 0
    vectors: list[torch.Tensor | None] = field(default_factory=list)
    aborted: bool = False
    completed: bool = False


class BatchListener(Protocol):
    def on_batch(self, num_inputs: int, num_tokens: int, seconds: float) -> None: ...

    def on_finished(self, job: EmbedJob, result: EmbedResult) -> None: ...


class EmbeddingBatcher:
    def __init__(self, embedder: Embedder, listener: BatchListener | None = None,
                 max_waiting_inputs: int = 1 << 16) -> None:
        self.embedder = embedder
        self._listener = listener
        self._max_waiting = max_waiting_inputs
        self._jobs: deque[EmbedJob] = deque()
        self._waiting_inputs = 0
        self._cond = threading.Condition()
        self._closed = False
        cfg = embedder.config
        self._workers = cfg.num_workers if embedder.device.type == "cpu" else 1
        # Read in the constructing thread (the model's, which Embedder set); each worker sets its own.
        self._total_threads = torch.get_num_threads()
        self._busy = 0  # workers inside a pass
        self._threads_in_use = 0  # by the passes running
        self._threads = [threading.Thread(target=self._loop, name="kvserve-embed", daemon=True)
                         for _ in range(self._workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, job: EmbedJob) -> None:
        job.vectors = [None] * len(job.inputs)
        with self._cond:
            if self._closed:
                raise BatcherClosed("the embedding model is shutting down")
            if self._waiting_inputs + len(job.inputs) > self._max_waiting:
                raise BatcherOverloaded("the waiting queue is full")
            self._jobs.append(job)
            self._waiting_inputs += len(job.inputs)
            self._cond.notify()

    def abort(self, request_id: str) -> None:
        """The job leaves before its next pass; nothing is sent for it."""
        with self._cond:
            for job in self._jobs:
                if job.request_id == request_id:
                    job.aborted = True

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    # ---- the batcher thread ----------------------------------------------------------------
    def _take(self, max_inputs: int) -> list[tuple[EmbedJob, int]]:
        """(job, input index) pairs for the next pass, in arrival order (caller holds the lock)."""
        cfg = self.embedder.config
        max_seqs = min(cfg.max_num_seqs, max_inputs)
        chosen: list[tuple[EmbedJob, int]] = []
        tokens = 0
        if any(job.aborted for job in self._jobs):
            for job in self._jobs:
                if job.aborted:
                    self._waiting_inputs -= len(job.inputs) - job.next_input
            self._jobs = deque(job for job in self._jobs if not job.aborted)
        for job in self._jobs:
            while job.next_input < len(job.inputs) and len(chosen) < max_seqs:
                n = len(job.inputs[job.next_input])
                if chosen and tokens + n > cfg.max_num_batched_tokens:
                    return chosen
                chosen.append((job, job.next_input))
                tokens += n
                job.next_input += 1
                self._waiting_inputs -= 1
            if len(chosen) >= max_seqs:
                break
        return chosen

    def _has_work(self) -> bool:
        return any(j.next_input < len(j.inputs) and not j.aborted for j in self._jobs)

    def _loop(self) -> None:
        name_this_thread()
        threads = 0
        while True:
            with self._cond:
                # A worker starts only on threads no running pass holds: more compute threads than
                # cores would leave a multi-threaded pass stalled at its barriers.
                while not self._closed and (not self._has_work() or self._threads_in_use >= self._total_threads):
                    self._cond.wait()
                if self._closed:
                    pending, self._jobs = list(self._jobs), deque()
                    break
                free = self._total_threads - self._threads_in_use
                slots = max(1, min(self._workers - self._busy, free))  # passes that may start now
                chosen = self._take(-(-self._waiting_inputs // slots))  # this worker's share
                # Jobs whose every input is now in a pass leave the queue; they finish below.
                while self._jobs and self._jobs[0].next_input == len(self._jobs[0].inputs):
                    self._jobs.popleft()
                started = time.time()
                for job in dict.fromkeys(job for job, _ in chosen):
                    job.passes += 1
                    if job.scheduled is None:
                        job.scheduled = started
                # All the free threads for a pass that runs alone, an equal part when another
                # worker starts beside it on the rest of the queue.
                splitting = self._waiting_inputs > 0 and slots > 1
                wanted = max(1, free // slots if splitting else free)
                self._threads_in_use += wanted
                self._busy += 1
                if splitting:
                    self._cond.notify()
            if wanted != threads:
                _set_own_threads(wanted)
                threads = wanted
            try:
                self._run(chosen, started)
            finally:
                with self._cond:
                    self._busy -= 1
                    self._threads_in_use -= wanted
                    if self._workers > 1:
                        self._cond.notify_all()  # a worker held back for threads may start
        for job in pending:
            self._complete(job, "the embedding model is shutting down", ErrorKind.SHUTDOWN)

    def _run(self, chosen: list[tuple[EmbedJob, int]], started: float) -> None:
        inputs = [job.inputs[i] for job, i in chosen]
        jobs = list(dict.fromkeys(job for job, _ in chosen))
        try:
            vectors = self.embedder.embed(inputs)
        except Exception as exc:
            log.error("embedding pass of %d inputs failed (%s)", len(inputs), type(exc).__name__)
            log.debug("embedding pass failure", exc_info=True)
            for job in jobs:
                self._complete(job, "internal error in the embedding model", ErrorKind.INTERNAL)
            return
        if self._listener is not None:
            self._listener.on_batch(len(inputs), sum(len(x) for x in inputs), time.time() - started)
        with self._cond:  # another worker may be finishing other inputs of the same jobs
            for row, (job, i) in enumerate(chosen):
                job.vectors[i] = vectors[row]
                job.done += 1
            finished = [job for job in jobs if job.done == len(job.inputs) and not job.aborted]
        for job in finished:
            self._complete(job)

    def _complete(self, job: EmbedJob, error: str | None = None, kind: ErrorKind | None = None) -> None:
        with self._cond:  # two workers may end the same job (one pass failed, another finished)
            if job.completed:
                return
            job.completed = True
        embeddings = None
        if error is None:
            try:
                stacked = torch.stack(job.vectors)  # type: ignore[arg-type]
                embeddings = self.embedder.finish(stacked, job.dimensions, job.normalize).numpy()
            except Exception as exc:
                log.error("finishing embeddings failed (%s)", type(exc).__name__)
                error, kind = "internal error in the embedding model", ErrorKind.INTERNAL
        result = EmbedResult(job.request_id, embeddings, [len(x) for x in job.inputs], job.arrival, job.scheduled,
                             time.time(), job.passes, error, kind)
        job.vectors = []
        for callback in (job.on_done, (lambda r: self._listener.on_finished(job, r)) if self._listener else None):
            if callback is None:
                continue
            try:
                callback(result)
            except Exception:
                log.exception("an embedding callback failed")
