"""InferenceResponse and the per-request response sender.

The sender enforces the rules of Triton's ResponseSender (flags, one response
for non-decoupled models, nothing after FINAL) and hands each response to the
host under a per-request lock, so a FINAL sent from one thread can never
overtake a data response sent a moment earlier from another.
"""
from __future__ import annotations

import json
import threading
from typing import Any, Protocol

from .triton_errors import TritonError, TritonModelException
from .tensor import Tensor

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


def parameters_to_json(parameters: Any, what: str) -> str:
    """Triton accepts only bool/int/str parameter values and keeps them as JSON."""
    if parameters is None:
        return "{}"
    if not isinstance(parameters, dict):
        raise TritonModelException(f"{what} parameters must be a dict")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
    return json.dumps(parameters)


class InferenceResponse:
    __slots__ = ("_output_tensors", "_error", "_parameters")

    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, bool | int | str] | None = None,
    ) -> None:
        tensors = [] if output_tensors is None else output_tensors
        if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, Tensor) for t in tensors):
            raise TritonModelException('"output_tensors" must be a list of pb_utils.Tensor.')
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException('"error" must be a pb_utils.TritonError or None.')
        self._output_tensors = list(tensors)
        self._error = error
        self._parameters = parameters_to_json(parameters, "response")

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


class ResponseSink(Protocol):
    """What the host gives each request: where responses go and whether it was cancelled."""

    def deliver(self, response: InferenceResponse | None, flags: int) -> None: ...

    def is_cancelled(self) -> bool: ...


class InferenceResponseSender:
    __slots__ = ("_sink", "_decoupled", "_lock", "_closed", "_sent")

    def __init__(self, sink: ResponseSink, decoupled: bool) -> None:
        self._sink = sink
        self._decoupled = decoupled
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL and flags != 0:
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException("Unable to send response. Expected a pb_utils.InferenceResponse.")
        with self._lock:
            self._update_state(response, flags)
            self._sink.deliver(response, flags)

    def is_cancelled(self) -> bool:
        return self._sink.is_cancelled()

    def _update_state(self, response: InferenceResponse | None, flags: int) -> None:
        # Same checks, same order and same messages as Triton's UpdateStateAndCounters.
        if not self._decoupled:
            if response is not None and self._sent > 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one response."
                )
            if response is None and flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL and self._sent == 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final "
                    "before sending a response."
                )
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._closed = True
        self._sent += 1

    # ---- host side (not part of Triton's API) ----

    def _send_returned(self, response: InferenceResponse) -> None:
        """A response returned from execute(): sent with FINAL, as Triton does."""
        with self._lock:
            self._update_state(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            self._sink.deliver(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _fail(self, message: str, code: int = TritonError.INTERNAL) -> None:
        """Error + FINAL unless already closed; then no further sends are accepted."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._sink.deliver(
                InferenceResponse(error=TritonError(message, code)), TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )

    def _is_closed(self) -> bool:
        with self._lock:
            return self._closed
