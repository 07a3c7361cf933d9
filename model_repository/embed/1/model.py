"""kvserve's embedding model as a Triton Python-backend model (decoupled).

Runs unchanged in NVIDIA's tritonserver (with kvserve installed in its Python)
and in kvserve's embedded host: it uses only `triton_python_backend_utils` and
hands everything to `kvserve.backend.embed.embed_triton_model`.
"""
import os

# As in the llm model: OpenMP workers sleep soon between the ops of one pass (BENCHMARKS.md, section 2).
if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "10000"

import triton_python_backend_utils as pb_utils  # noqa: E402

from kvserve.backend.embed import TritonEmbedModel  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        self.impl = TritonEmbedModel(pb_utils, args)

    def execute(self, requests):
        return self.impl.execute(requests)

    def finalize(self):
        self.impl.finalize()
