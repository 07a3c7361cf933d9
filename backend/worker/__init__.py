"""The model runner and what only it uses (CUDA graphs and their buckets, CPU threads, the hot-path
ops): a SchedulerOutput in, logits out. It never decides who runs. The home of the workers and
the executor that split a model over ranks."""
from __future__ import annotations

import importlib

# Public names -> the module that defines them, imported on first use (PEP 562). Sibling packages
# import only these names (tests/contract/test_import_rules.py), and nothing loads before it is used.
_EXPORTS = {
    "ModelRunner": ".model_runner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
