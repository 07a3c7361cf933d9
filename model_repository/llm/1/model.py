"""kvserve as a Triton Python-backend model (decoupled).

Runs unchanged in NVIDIA's tritonserver (with kvserve installed in its Python)
and in kvserve's embedded host: it uses only `triton_python_backend_utils` and
hands everything to `kvserve.backend.triton_model`.
"""
import triton_python_backend_utils as pb_utils

from kvserve.backend.triton_model import TritonLLMModel


class TritonPythonModel:
    def initialize(self, args):
        self.impl = TritonLLMModel(pb_utils, args)

    def execute(self, requests):
        return self.impl.execute(requests)

    def is_model_ready(self):
        # User-defined readiness (Triton Python backend): false while the engine
        # recovers from a failed step. Older tritonservers simply never call it.
        return self.impl.is_model_ready()

    def finalize(self):
        self.impl.finalize()
