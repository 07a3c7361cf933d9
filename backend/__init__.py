"""kvserve.backend: the engine (scheduler, paged KV cache, model runner, sampler) and the embedded host.

Heavy modules (torch) load on first use, so `kvserve.backend.host` can start
without importing the engine.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvserve.backend.async_engine import AsyncEngine
    from kvserve.backend.config import EngineConfig
    from kvserve.backend.engine import LLMEngine
    from kvserve.backend.llm import LLM
    from kvserve.backend.outputs import CompletionOutput, RequestOutput
    from kvserve.backend.sampling_params import SamplingParams

_EXPORTS = {
    "AsyncEngine": "kvserve.backend.async_engine",
    "EngineConfig": "kvserve.backend.config",
    "LLMEngine": "kvserve.backend.engine",
    "LLM": "kvserve.backend.llm",
    "CompletionOutput": "kvserve.backend.outputs",
    "RequestOutput": "kvserve.backend.outputs",
    "SamplingParams": "kvserve.backend.sampling_params",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kvserve.backend' has no attribute {name!r}")
