"""AsyncEngine: built and run on its own thread; start-up errors reach the caller."""
from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from kvserve.backend import SamplingParams
from kvserve.backend import async_engine
from kvserve.backend.async_engine import AsyncEngine
from kvserve.backend.config import EngineConfig


def test_engine_is_built_on_the_thread_that_steps_it(llama_dir, monkeypatch):
    # One thread does all the torch work: a second OpenMP team (the loading
    # thread's) makes libgomp put its workers to sleep after every parallel region.
    seen = []
    real = async_engine.LLMEngine

    def recording(config):
        seen.append(threading.current_thread().name)
        return real(config)

    monkeypatch.setattr(async_engine, "LLMEngine", recording)
    engine = AsyncEngine(EngineConfig(model=llama_dir, max_model_len=128))
    try:
        done = threading.Event()
        outputs = []
        engine.add_request("r", "Once upon a time", SamplingParams(max_tokens=3, temperature=0),
                           lambda out: (outputs.append(out), out.finished and done.set()))
        assert done.wait(60) and outputs[-1].finished
        assert seen == ["kvserve-engine"] and engine.tokenizer is not None and engine.healthy()
    finally:
        engine.shutdown()


def test_start_up_failure_is_raised_to_the_caller(llama_dir, tmp_path):
    for f in Path(llama_dir).iterdir():  # the model without its weights
        if f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    with pytest.raises(ValueError, match="safetensors"):
        AsyncEngine(EngineConfig(model=str(tmp_path)))
    assert not any(t.name == "kvserve-engine" and t.is_alive() for t in threading.enumerate())


def test_the_timeout_counts_from_arrival(llama_dir):
    """`arrival` is when the request reached the server (before its tokenization):
    a request that spent its whole timeout on the way in ends without running."""
    import time

    from kvserve.seam.error_wire import ErrorKind

    engine = AsyncEngine(EngineConfig(model=llama_dir, max_model_len=128))
    try:
        outs, done = [], threading.Event()
        engine.add_request("late", "Once upon a time", SamplingParams(max_tokens=50, timeout=1.0),
                           lambda out: (outs.append(out), out.finished and done.set()), arrival=time.time() - 5)
        assert done.wait(30)
        assert outs[-1].error_kind is ErrorKind.TIMEOUT
        assert sum(len(c.token_ids) for o in outs for c in o.outputs) == 0
    finally:
        engine.shutdown()
