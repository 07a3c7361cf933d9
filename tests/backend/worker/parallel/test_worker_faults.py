"""A tensor-parallel worker that dies (kill -9) or hangs (SIGSTOP) past the bound takes the engine
down cleanly: the in-flight request ends with an error, the engine reports not ready and refuses
new requests, `on_fatal` is called (the Triton model exits the process with it), and no rank is
left running. The same while idle: the loss is noticed without a request."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from kvserve.backend import SamplingParams
from kvserve.backend.engine import AsyncEngine, EngineConfig
from kvserve.backend.worker import WorkerLost

pytestmark = pytest.mark.timeout(300)

BOUND_S = 4.0


@pytest.fixture()
def engine(llama_dir, monkeypatch):
    monkeypatch.setenv("KVSERVE_TP_STEP_TIMEOUT_S", str(BOUND_S))
    eng = AsyncEngine(EngineConfig(model=llama_dir, max_model_len=2048, num_kv_blocks=256, tensor_parallel_size=2))
    fatal: list[BaseException] = []
    eng.on_fatal = fatal.append
    eng.fatal = fatal
    yield eng
    eng.shutdown()
    eng.engine.runner.close(graceful=False)


def _stream(eng: AsyncEngine):
    """Start one long request; returns (outputs seen, an event set when it finished)."""
    outs, done = [], threading.Event()

    def callback(out):
        outs.append(out)
        if out.finished:
            done.set()

    eng.add_request("long", "a b c", SamplingParams(max_tokens=1900, temperature=0, ignore_eos=True), callback)
    deadline = time.monotonic() + 60
    while not outs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert outs, "no token before the fault"
    return outs, done


def _assert_stopped_cleanly(eng: AsyncEngine, outs, done, within_s: float) -> None:
    assert done.wait(within_s), "the in-flight request never ended"
    assert outs[-1].error and "parallel worker (tensor or pipeline) was lost" in outs[-1].error
    assert not outs[-1].outputs or outs[-1].outputs[0].finish_reason != "length"
    assert len(eng.fatal) == 1 and isinstance(eng.fatal[0], WorkerLost)
    assert not eng.healthy()
    with pytest.raises(Exception, match="shutting down"):
        eng.add_request("late", "x", SamplingParams(max_tokens=2), lambda out: None)
    procs = eng.engine.runner.executor.procs
    deadline = time.monotonic() + 10
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(p.poll() is not None for p in procs), "a rank is left running"


def test_kill_9_of_a_worker_mid_stream(engine):
    outs, done = _stream(engine)
    os.kill(engine.engine.runner.executor.procs[0].pid, signal.SIGKILL)
    _assert_stopped_cleanly(engine, outs, done, within_s=BOUND_S + 10)


def test_sigstop_of_a_worker_past_the_bound(engine):
    outs, done = _stream(engine)
    worker = engine.engine.runner.executor.procs[0]
    os.kill(worker.pid, signal.SIGSTOP)
    started = time.monotonic()
    try:
        _assert_stopped_cleanly(engine, outs, done, within_s=BOUND_S + 20)
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
    assert time.monotonic() - started >= BOUND_S * 0.9  # it waited for the bound, not less


def test_a_worker_lost_while_idle_is_noticed_without_a_request(engine):
    os.kill(engine.engine.runner.executor.procs[0].pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not engine.fatal and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.fatal and not engine.healthy()


def test_a_worker_stopped_while_idle_fails_the_next_request_within_the_bound(engine):
    """Stopped while it waited for a step (its receive already posted), the worker never takes
    the step's bytes: rank 0's send must be bounded too, or it hangs before any collective."""
    worker = engine.engine.runner.executor.procs[0]
    time.sleep(0.5)  # the worker is in its receive
    os.kill(worker.pid, signal.SIGSTOP)
    outs, done = [], threading.Event()

    def callback(out):
        outs.append(out)
        if out.finished:
            done.set()

    started = time.monotonic()
    try:
        engine.add_request("next", "a b c", SamplingParams(max_tokens=8, temperature=0), callback)
        _assert_stopped_cleanly(engine, outs, done, within_s=BOUND_S + 20)
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
    assert time.monotonic() - started >= BOUND_S * 0.9
