# initialize() raises: the host must report this model not ready and keep serving the others.
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("initialize failed on purpose")

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]
