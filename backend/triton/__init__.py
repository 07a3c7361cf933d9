"""The Python-backend glue that model_repository/llm/1/model.py imports: the Triton model over
AsyncEngine, Triton tensors <-> engine requests and outputs, and the engine's metrics and spans."""
from __future__ import annotations

import importlib

# Public names -> the module that defines them, imported on first use (PEP 562). Sibling packages
# import only these names (tests/contract/test_import_rules.py), and nothing loads before it is used.
_EXPORTS = {
    "TritonLLMModel": ".triton_model",
    "X_REQUEST_ID_PARAM": ".telemetry",
    "as_text": ".model_tensors",
    "first_scalar": ".model_tensors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
