"""The gateway's gRPC requests as the Triton model sees them, for contract tests."""
from __future__ import annotations

import json
import types


def as_backend_request(msg):
    """What the Triton model's request.parameters() gives for the gateway's ModelInferRequest."""
    params = {}
    for key, value in msg.parameters.items():
        params[key] = value.string_param if value.WhichOneof("parameter_choice") == "string_param" else value.bool_param
    return types.SimpleNamespace(parameters=lambda: json.dumps(params))
