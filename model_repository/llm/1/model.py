"""kvserve as a Triton Python-backend model (decoupled).

Runs unchanged in NVIDIA's tritonserver (with kvserve installed in its Python)
and in kvserve's embedded host: it uses only `triton_python_backend_utils` and
hands everything to `kvserve.backend.triton.triton_model`.
"""
import os

# Before torch loads libgomp: OpenMP workers spin for GOMP_SPINCOUNT iterations
# between parallel regions before they sleep. libgomp's default (300,000) keeps
# them spinning through the Python parts of every engine step, on cores the
# serving path (responses, gRPC, often the gateway) needs; far less (3,000) puts
# them to sleep between the ops of one forward pass (BENCHMARKS.md, section 2).
# The user's own setting wins; replicas sharing cores want 100 (docs/deployment.md, "Scaling out").
if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "10000"

import triton_python_backend_utils as pb_utils  # noqa: E402

from kvserve.backend.triton import TritonLLMModel  # noqa: E402


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
