"""The `triton_python_backend_utils` module of the embedded host.

Same names and semantics as Triton's Python backend, so a model.py written for
tritonserver runs here unchanged. `install()` registers this package under the
name model.py imports (`import triton_python_backend_utils as pb_utils`).
"""
from __future__ import annotations

import sys
from types import ModuleType

from .config_helpers import (
    ModelConfig,
    get_input_config_by_name,
    get_input_tensor_by_name,
    get_output_config_by_name,
    get_output_tensor_by_name,
    using_decoupled_model_transaction_policy,
)
from .dtypes import (
    TRITON_STRING_TO_NUMPY,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from .triton_errors import TritonError, TritonModelException
from .host_hooks import get_model_dir, is_model_ready, load_model, unload_model
from .logger import Logger
from .metric_family import Metric, MetricFamily
from .inference_request import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    InferenceRequest,
    InferenceTrace,
    PreferredMemory,
)
from .response import TRITONSERVER_RESPONSE_COMPLETE_FINAL, InferenceResponse, InferenceResponseSender
from .tensor import Tensor

TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_GPU = 1

MODULE_NAME = "triton_python_backend_utils"

__all__ = [
    "InferenceRequest", "InferenceResponse", "InferenceResponseSender", "InferenceTrace", "Logger",
    "Metric", "MetricFamily", "ModelConfig", "PreferredMemory", "Tensor", "TritonError",
    "TritonModelException", "TRITON_STRING_TO_NUMPY", "TRITONSERVER_MEMORY_CPU", "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL", "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "deserialize_bytes_tensor", "get_input_config_by_name",
    "get_input_tensor_by_name", "get_model_dir", "get_output_config_by_name", "get_output_tensor_by_name",
    "is_model_ready", "load_model", "numpy_to_triton_type", "serialize_byte_tensor",
    "triton_string_to_numpy", "triton_to_numpy_type", "unload_model",
    "using_decoupled_model_transaction_policy",
]


def install() -> ModuleType:
    """Make `import triton_python_backend_utils` resolve to this package.

    A real Triton module already imported (e.g. a stub shim) is replaced: model.py
    must talk to this host, not to a backend that is not running.
    """
    module = sys.modules[__name__]
    sys.modules[MODULE_NAME] = module
    return module
