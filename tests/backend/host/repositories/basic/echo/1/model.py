# Non-decoupled BYTES model. TEXT is upper-cased into TEXT_OUT; PARAMS echoes
# request.parameters(); INFO describes the request. A first element of b"raise"
# makes execute raise, b"error" returns a TritonError response, b"args" returns
# the initialize() args.
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        self.requests = pb_utils.MetricFamily(
            name="echo_requests_total",
            description="Requests seen by the echo test model",
            kind=pb_utils.MetricFamily.COUNTER,
        ).Metric(labels={"model": args["model_name"]})

    def execute(self, requests):
        responses = []
        for request in requests:
            self.requests.increment(1)
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            first = text.reshape(-1)[0] if text.size else b""
            if first == b"raise":
                raise ValueError("echo was asked to raise")
            if first == b"error":
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("echo was asked for an error", pb_utils.TritonError.NOT_FOUND)))
                continue
            if first == b"args":
                out = np.array([json.dumps(self.args).encode()], dtype=np.object_)
            else:
                out = np.array([t.upper() for t in text.reshape(-1)], dtype=np.object_).reshape(text.shape)
            info = {
                "request_id": request.request_id(),
                "correlation_id": request.correlation_id(),
                "flags": request.flags(),
                "requested": request.requested_output_names(),
                "missing_input_is_none": pb_utils.get_input_tensor_by_name(request, "NOPE") is None,
                "cancelled": request.is_cancelled(),
            }
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor("TEXT_OUT", out),
                    pb_utils.Tensor("PARAMS", np.array([request.parameters().encode()], dtype=np.object_)),
                    pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=np.object_)),
                ],
                parameters={"echoed": True},
            ))
        return responses
