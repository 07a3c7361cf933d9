"""The engine's test hooks live in one frozen section, `EngineConfig.debug`, and are still set by
their own names from strings (config.pbtxt parameters, KVSERVE_* variables)."""
from __future__ import annotations

import dataclasses

import pytest

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.engine.config import DebugConfig, EngineConfig, env_overrides
from kvserve.backend.worker.model_runner import InjectedFault


def test_test_hooks_are_the_debug_section_not_engine_arguments(llama_dir) -> None:
    config = EngineConfig(model=llama_dir)
    assert config.debug == DebugConfig() and config.debug.fault_injection_step is None
    assert not config.debug.log_scheduling
    hooks = [f.name for f in dataclasses.fields(DebugConfig)]
    assert not set(hooks) & set(EngineConfig.field_names())
    assert EngineConfig.setting_names() == EngineConfig.field_names() + hooks
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.debug.log_scheduling = True  # type: ignore[misc]


def test_strings_set_the_hooks_by_their_own_names(llama_dir, monkeypatch) -> None:
    config = EngineConfig.from_strings({"model": llama_dir, "fault_injection_step": "3", "log_scheduling": "true",
                                        "max_num_seqs": "4"})
    assert config.debug == DebugConfig(fault_injection_step=3, log_scheduling=True)
    assert config.max_num_seqs == 4
    monkeypatch.setenv("KVSERVE_FAULT_INJECTION_STEP", "2")
    monkeypatch.setenv("KVSERVE_LOG_SCHEDULING", "1")
    assert env_overrides() == {"fault_injection_step": "2", "log_scheduling": "1"}
    with pytest.raises(ValueError, match="fault_injection_step: cannot parse"):
        EngineConfig.from_strings({"model": llama_dir, "fault_injection_step": "soon"})


def test_the_fault_hook_fires_from_the_debug_section(llama_dir) -> None:
    llm = LLM(llama_dir, debug=DebugConfig(fault_injection_step=2))
    with pytest.raises(InjectedFault, match="step 2"):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))
    with pytest.raises(TypeError, match="fault_injection_step"):
        LLM(llama_dir, fault_injection_step=2)  # a hook is no engine argument of its own
