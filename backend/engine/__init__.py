"""The engine core: LLMEngine's step (scheduler -> runner -> sampler -> detokenizer -> stop),
AsyncEngine on its thread, requests and their sampling parameters, admission, outputs, and the
offline `LLM`. It decides who runs; the worker runs them."""
from __future__ import annotations

from kvserve.backend import exports_loader

# Public names -> the module that defines them. Sibling packages import only these names
# (tests/contract/test_import_rules.py), and each loads on first use.
_EXPORTS = {
    "AsyncEngine": ".async_engine",
    "CompletionOutput": ".outputs",
    "DebugConfig": ".config",
    "EngineClosed": ".async_engine",
    "EngineConfig": ".config",
    "EngineOverloaded": ".async_engine",
    "EngineStats": ".outputs",
    "LLM": ".llm",
    "LLMEngine": ".engine",
    "Request": ".request",
    "RequestOutput": ".outputs",
    "SamplingParams": ".sampling_params",
    "ScheduledRequest": ".scheduler",
    "SchedulerOutput": ".scheduler",
    "TokenLogprob": ".outputs",
    "env_overrides": ".config",
    "greedy_tokens": ".sampler",
}
__all__ = sorted(_EXPORTS)
__getattr__ = exports_loader(__name__, _EXPORTS)
