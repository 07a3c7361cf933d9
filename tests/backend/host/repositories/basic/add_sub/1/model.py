# A Triton Python-backend model in the shape of Triton's add_sub example; it
# uses only triton_python_backend_utils, so it would run in tritonserver too.
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        out0 = pb_utils.get_output_config_by_name(self.model_config, "OUTPUT0")
        out1 = pb_utils.get_output_config_by_name(self.model_config, "OUTPUT1")
        self.out0_dtype = pb_utils.triton_string_to_numpy(out0["data_type"])
        self.out1_dtype = pb_utils.triton_string_to_numpy(out1["data_type"])
        pb_utils.Logger.log_info("add_sub initialized")
        print("add_sub prints to stdout, as Triton's examples do")

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out0 = pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(self.out0_dtype))
            out1 = pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(self.out1_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("add_sub finalize called")
