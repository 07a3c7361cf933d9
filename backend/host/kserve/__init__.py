"""The KServe v2 gRPC front of the host, as tritonserver serves it: the GRPCInferenceService, the
multiplexed ModelStreamInfer stream, requests read as bytes off the event loop and checked against
the model config, tensors to and from protobuf, and the hand-off from model threads to the loop."""
