"""Encoder serving: the embedding model, the batcher that packs many requests into one forward,
its tensors codec and telemetry, and the Triton model that model_repository/embed/1/model.py imports."""
from __future__ import annotations

import importlib

# Public names -> the module that defines them, imported on first use (PEP 562). Sibling packages
# import only these names (tests/contract/test_import_rules.py), and nothing loads before it is used.
_EXPORTS = {
    "TritonEmbedModel": ".embed_triton_model",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
