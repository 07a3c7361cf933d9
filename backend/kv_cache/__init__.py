"""The paged KV cache's bookkeeping, pure Python: the block pool, the prefix hash chain, the KV manager
that hands out and frees a request's blocks, and the arithmetic of how many blocks fit."""
from __future__ import annotations

import importlib

# Public names -> the module that defines them, imported on first use (PEP 562). Sibling packages
# import only these names (tests/contract/test_import_rules.py), and nothing loads before it is used.
_EXPORTS = {
    "CudaMemoryProfile": ".kv_budget",
    "KVCacheManager": ".manager",
    "describe": ".kv_budget",
    "kv_budget_bytes": ".kv_budget",
    "profile_query_lens": ".kv_budget",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
