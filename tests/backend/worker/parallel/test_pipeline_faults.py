"""A pipeline stage that dies (kill -9) or stops (SIGSTOP) past the bound takes the engine down as a
tensor-parallel rank does (test_worker_faults.py): the in-flight request ends with an error, the
engine reports not ready, `on_fatal` is called and no rank is left running. Rank 0 notices while
it waits for the last stage's logits (a killed stage's socket closes at once; a stopped one keeps
it open, so only the bound ends the wait)."""
from __future__ import annotations

import os
import signal
import time

import pytest

from kvserve.backend.engine import AsyncEngine, EngineConfig
from tests.backend.worker.parallel.test_worker_faults import BOUND_S, _assert_stopped_cleanly, _stream

pytestmark = pytest.mark.timeout(300)


@pytest.fixture()
def engine(llama_dir, monkeypatch):
    monkeypatch.setenv("KVSERVE_TP_STEP_TIMEOUT_S", str(BOUND_S))
    eng = AsyncEngine(EngineConfig(model=llama_dir, max_model_len=2048, num_kv_blocks=256, pipeline_parallel_size=2))
    fatal: list[BaseException] = []
    eng.on_fatal = fatal.append
    eng.fatal = fatal
    yield eng
    eng.shutdown()
    eng.engine.runner.close(graceful=False)


def test_kill_9_of_the_last_stage_mid_stream(engine):
    assert engine.engine.runner.stage.last is False  # rank 0 is the first stage; the worker the last
    outs, done = _stream(engine)
    os.kill(engine.engine.runner.executor.procs[0].pid, signal.SIGKILL)
    _assert_stopped_cleanly(engine, outs, done, within_s=BOUND_S + 10)


def test_sigstop_of_the_last_stage_past_the_bound(engine):
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
