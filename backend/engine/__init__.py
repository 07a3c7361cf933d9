"""The engine core: LLMEngine's step (scheduler -> runner -> sampler -> detokenizer -> stop),
AsyncEngine on its thread, requests and their sampling parameters, admission, outputs, and the
offline `LLM`. It decides who runs; the worker runs them."""
from __future__ import annotations

import importlib

# Public names -> the module that defines them, imported on first use (PEP 562). Sibling packages
# import only these names (tests/contract/test_import_rules.py), and nothing loads before it is used.
_EXPORTS = {
    "AsyncEngine": ".async_engine",
    "CompletionOutput": ".outputs",
    "EngineClosed": ".async_engine",
    "EngineConfig": ".config",
    "EngineOverloaded": ".async_engine",
    "EngineStats": ".outputs",
    "LLM": ".llm",
    "LLMEngine": ".engine",
    "Request": ".request",
    "RequestOutput": ".outputs",
    "SamplingParams": ".sampling_params",
    "SchedulerOutput": ".scheduler",
    "TokenLogprob": ".outputs",
    "env_overrides": ".config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
