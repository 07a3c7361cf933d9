"""Encoder serving: the embedding model, the batcher that packs many requests into one forward,
its tensors codec and telemetry, and the Triton model that model_repository/embed/1/model.py imports."""
from __future__ import annotations

from kvserve.backend import exports_loader

# Public names -> the module that defines them. Sibling packages import only these names
# (tests/contract/test_import_rules.py), and each loads on first use.
_EXPORTS = {
    "TritonEmbedModel": ".embed_triton_model",
}
__all__ = sorted(_EXPORTS)
__getattr__ = exports_loader(__name__, _EXPORTS)
