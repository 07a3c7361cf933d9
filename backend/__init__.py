"""kvserve.backend: the engine (scheduler, paged KV cache, model runner, sampler) and the embedded host.

Heavy modules (torch) load on first use, so `kvserve.backend.host` can start
without importing the engine.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from kvserve.backend.engine import (LLM, AsyncEngine, CompletionOutput, EngineConfig, LLMEngine, RequestOutput,
                                        SamplingParams)

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


def exports_loader(package: str, table: dict[str, str]) -> Callable[[str], object]:
    """A package's `__getattr__` (PEP 562) over its table of public names: importing the package loads
    nothing, and a sibling that asks for one name loads only the module that defines it."""
    def load(name: str) -> object:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(table[name], package), name)
    return load


__getattr__ = exports_loader(__name__, _EXPORTS)
