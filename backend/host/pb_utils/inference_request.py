"""pb_utils.InferenceRequest as a model sees it, plus the host-side constructor.

The public constructor exists in Triton for BLS (a model calling another model);
the embedded host does not run BLS, so `exec`/`async_exec` raise.
"""
from __future__ import annotations

import json
from typing import Any

from .triton_errors import TritonModelException
from .response import InferenceResponseSender, ResponseSink, parameters_to_json
from .tensor import Tensor

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class PreferredMemory:
    """Accepted for signature compatibility; every tensor here lives in CPU memory."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """Triton's request trace handle; the embedded host has no Triton tracing."""

    def get_context(self) -> str | None:
        return None


class InferenceRequest:
    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_name: str | None = None,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        # pybind marks these three as required and not None in Triton.
        if inputs is None or requested_output_names is None or model_name is None:
            raise TypeError("InferenceRequest requires inputs, requested_output_names and model_name")
        if not isinstance(correlation_id, (int, str)):
            raise TritonModelException("Correlation ID must be integer or string")
        self._request_id = str(request_id)
        self._correlation_id = correlation_id
        self._inputs = list(inputs)
        self._requested_output_names = list(requested_output_names)
        self._model_name = model_name
        self._model_version = int(model_version)
        self._flags = int(flags)
        self._timeout = int(timeout)
        self._parameters = parameters_to_json(parameters, "request")
        self._trace = trace if trace is not None else InferenceTrace()
        self._sender: InferenceResponseSender | None = None
        self._sink: ResponseSink | None = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = int(flags)

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def trace(self) -> InferenceTrace:
        return self._trace

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException("Unable to get the response sender of a request created by the model.")
        return self._sender

    def is_cancelled(self) -> bool:
        return self._sink.is_cancelled() if self._sink is not None else False

    def set_release_flags(self, flags: int) -> None:
        if flags == TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException("Request rescheduling is not supported by the kvserve embedded host.")
        self._release_flags = int(flags)

    def exec(self, decoupled: bool = False) -> Any:
        raise TritonModelException("BLS requests are not supported by the kvserve embedded host.")

    def async_exec(self, decoupled: bool = False) -> Any:
        raise TritonModelException("BLS requests are not supported by the kvserve embedded host.")


def new_server_request(
    *,
    request_id: str,
    correlation_id: int | str,
    inputs: list[Tensor],
    requested_output_names: list[str],
    model_name: str,
    model_version: int,
    flags: int,
    timeout: int,
    parameters: dict[str, Any],
    sink: ResponseSink,
    decoupled: bool,
) -> InferenceRequest:
    """A request arriving from a client. Parameters may hold doubles (gRPC
    double_param), which the BLS constructor would refuse, hence the bypass."""
    request = InferenceRequest(
        request_id=request_id,
        correlation_id=correlation_id,
        inputs=inputs,
        requested_output_names=requested_output_names,
        model_name=model_name,
        model_version=model_version,
        flags=flags,
        timeout=timeout,
    )
    request._parameters = json.dumps(parameters)
    request._sink = sink
    request._sender = InferenceResponseSender(sink, decoupled)
    return request
