"""The Python-backend glue that model_repository/llm/1/model.py imports: the Triton model over
AsyncEngine, Triton tensors <-> engine requests and outputs, and the engine's metrics and spans."""
from __future__ import annotations

from kvserve.backend import exports_loader

# Public names -> the module that defines them. Sibling packages import only these names
# (tests/contract/test_import_rules.py), and each loads on first use.
_EXPORTS = {
    "TritonLLMModel": ".triton_model",
    "X_REQUEST_ID_PARAM": ".telemetry",
    "as_text": ".model_tensors",
    "first_scalar": ".model_tensors",
}
__all__ = sorted(_EXPORTS)
__getattr__ = exports_loader(__name__, _EXPORTS)
