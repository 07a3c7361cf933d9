"""--cpu-reserved-cores: the engine's torch ops leave CPU cores to the serving path."""
from __future__ import annotations

import threading

import pytest
import torch

from kvserve.backend import SamplingParams
from kvserve.backend.engine.async_engine import AsyncEngine
from kvserve.backend.engine.config import EngineConfig
from kvserve.backend.worker.cpu_threads import engine_threads, torch_default_threads


def test_reserved_cores_come_off_torchs_default_and_an_explicit_count_wins() -> None:
    assert engine_threads(None, 0, 8) is None  # nothing reserved: torch's default stays
    assert engine_threads(None, 1, 8) == 7
    assert engine_threads(None, 3, 4) == 1
    assert engine_threads(5, 3, 8) == 5
    for reserved, available in ((2, 2), (3, 2), (1, 1)):
        with pytest.raises(ValueError, match="cpu_reserved_cores: .* leaves no CPU thread"):
            engine_threads(None, reserved, available)


def test_config_checks_and_parses_the_fields(llama_dir) -> None:
    assert EngineConfig.from_strings({"model": llama_dir, "cpu_reserved_cores": "1"}).cpu_reserved_cores == 1
    assert EngineConfig(model=llama_dir).cpu_reserved_cores == 0
    with pytest.raises(ValueError, match="cpu_reserved_cores"):
        EngineConfig(model=llama_dir, cpu_reserved_cores=-1)
    with pytest.raises(ValueError, match="num_threads"):
        EngineConfig(model=llama_dir, num_threads=0)


@pytest.fixture
def restore_torch_threads():
    yield
    # set_num_threads also changes what threads started later begin with; later tests must not inherit it.
    torch.set_num_threads(torch_default_threads())


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="needs torch to use at least 2 threads to reserve one")
def test_the_engine_thread_runs_with_the_cores_left(llama_dir, restore_torch_threads) -> None:
    default = torch_default_threads()
    engine = AsyncEngine(EngineConfig(model=llama_dir, max_model_len=128, cpu_reserved_cores=1))
    try:
        done = threading.Event()
        seen = []  # output callbacks run on the engine thread, whose OpenMP team does the model's work

        def on_output(out) -> None:
            seen.append(torch.get_num_threads())
            if out.finished:
                done.set()

        engine.add_request("r", "Once upon a time", SamplingParams(max_tokens=2, temperature=0), on_output)
        assert done.wait(60)
        assert set(seen) == {default - 1}
    finally:
        engine.shutdown()


def test_reserving_every_core_fails_at_start_up_with_the_field_named(llama_dir, restore_torch_threads) -> None:
    with pytest.raises(ValueError, match="cpu_reserved_cores"):
        AsyncEngine(EngineConfig(model=llama_dir, max_model_len=128, cpu_reserved_cores=torch_default_threads()))


def test_the_engine_thread_gets_torchs_default_whatever_another_thread_set_last(llama_dir, restore_torch_threads):
    """An embedding worker (any thread) setting one thread must not shrink an engine started after it."""
    default = torch_default_threads()
    other = threading.Thread(target=torch.set_num_threads, args=(1,))
    other.start()
    other.join()
    engine = AsyncEngine(EngineConfig(model=llama_dir, max_model_len=128))
    try:
        done = threading.Event()
        seen = []

        def on_output(out) -> None:
            seen.append(torch.get_num_threads())
            if out.finished:
                done.set()

        engine.add_request("r", "Once upon a time", SamplingParams(max_tokens=2, temperature=0), on_output)
        assert done.wait(60)
        assert set(seen) == {default}
    finally:
        engine.shutdown()
