"""The host's error type: a Triton error code with its message.

Codes are TRITONSERVER_Error_Code values (pb_utils.TritonError.*); the gRPC
layer maps them to status codes exactly as tritonserver's GrpcStatusUtil does.
"""
from __future__ import annotations

import grpc

from .pb_utils.triton_errors import TritonError

_GRPC_CODES = {
    TritonError.UNKNOWN: grpc.StatusCode.UNKNOWN,
    TritonError.INTERNAL: grpc.StatusCode.INTERNAL,
    TritonError.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    TritonError.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    TritonError.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    TritonError.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    TritonError.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    TritonError.CANCELLED: grpc.StatusCode.CANCELLED,
}


class InferError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def grpc_code(self) -> grpc.StatusCode:
        return grpc_status(self.code)


def grpc_status(code: int) -> grpc.StatusCode:
    return _GRPC_CODES.get(code, grpc.StatusCode.UNKNOWN)
