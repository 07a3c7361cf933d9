"""AsyncEngine: built and run on its own thread; start-up errors reach the caller."""
from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from kvserve.backend import SamplingParams
from kvserve.backend.engine import async_engine
from kvserve.backend.engine.async_engine import AsyncEngine
from kvserve.backend.engine.config import EngineConfig


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


def test_step_listeners_get_frozen_stats_and_each_token_gap_once(llama_dir):
    """Listeners receive an EngineStats (they no longer reach into the engine); its
    inter-token gaps are handed on once: n tokens of one request give n - 1 gaps in all."""
    import dataclasses

    from kvserve.backend.engine.outputs import EngineStats

    seen: list[EngineStats] = []
    engine = AsyncEngine(EngineConfig(model=llama_dir, max_model_len=128),
                         [lambda stats, outputs, started: seen.append(stats)])
    try:
        done = threading.Event()
        engine.add_request("r", "Once upon a time", SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
                           lambda out: out.finished and done.set())
        assert done.wait(60)
        deadline = threading.Event()
        deadline.wait(0.2)  # the listener of the last step ran
        assert seen and all(isinstance(s, EngineStats) for s in seen)
        with pytest.raises(dataclasses.FrozenInstanceError):
            seen[-1].num_requests_running = 3
        assert sum(len(s.inter_token_gaps) for s in seen) == 5
        assert seen[-1].generation_tokens_total == 6 and engine.stats().num_requests_running == 0
    finally:
        engine.shutdown()


def test_reset_prefix_cache_runs_on_the_engine_thread_between_steps(llama_dir):
    import itertools

    from kvserve.backend.engine.async_engine import EngineClosed

    engine = AsyncEngine(EngineConfig(model=llama_dir, max_model_len=512, block_size=16))
    ids = itertools.count()
    prompt = list(range(3, 70))  # four whole blocks and three tokens

    def run(max_tokens: int) -> tuple[list, threading.Event, threading.Event]:
        outs, started, done = [], threading.Event(), threading.Event()

        def on_output(out) -> None:
            outs.append(out)
            started.set()
            if out.finished:
                done.set()

        engine.add_request(f"r{next(ids)}", prompt, SamplingParams(max_tokens=max_tokens, temperature=0,
                                                                   ignore_eos=True), on_output)
        return outs, started, done

    try:
        outs, _, done = run(1)
        assert done.wait(60)
        long_outs, long_started, long_done = run(300)
        assert long_started.wait(60)  # running (most likely still) while the reset comes in
        assert engine.reset_prefix_cache(timeout=30) >= 4
        assert long_done.wait(60) and long_outs[-1].error is None
        assert sum(len(o.outputs[0].token_ids) for o in long_outs) == 300
        outs, _, done = run(1)
        assert done.wait(60) and outs[-1].num_cached_tokens == 0  # neither the first's nor the running one's
    finally:
        engine.shutdown()
    with pytest.raises(EngineClosed):
        engine.reset_prefix_cache()
