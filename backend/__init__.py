"""kvserve.backend: the engine (scheduler, paged KV cache, model runner, sampler) and the embedded host.

Heavy modules (torch) load on first use, so `kvserve.backend.host` can start
without importing the engine.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvserve.backend.engine import LLM, AsyncEngine, CompletionOutput, EngineConfig, LLMEngine, RequestOutput, SamplingParams

_EXPORTS = {
    "AsyncEngine": ".engine",
    "EngineConfig": ".engine",
    "LLMEngine": ".engine",
    "LLM": ".engine",
    "CompletionOutput": ".engine",
    "RequestOutput": ".engine",
    "SamplingParams": ".engine",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module 'kvserve.backend' has no attribute {name!r}")
