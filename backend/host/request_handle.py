"""The host side of one in-flight request.

It is the ResponseSink behind the request's pb_utils response sender: each
response is serialised in the sending thread (a model thread, never the event
loop) and handed to `emit`, which the gRPC layer makes thread-safe with
`loop.call_soon_threadsafe`. Cancellation is a threading.Event so that
`is_cancelled()` is a cheap read from any model thread.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from tritonclient.grpc import service_pb2 as pb

from .kserve.codec import encode_response
from .kserve.stream_wire import encode_stream_response, id_field
from .host_metrics import HostMetrics
from .pb_utils.triton_errors import TritonError, TritonModelException
from .pb_utils.response import TRITONSERVER_RESPONSE_COMPLETE_FINAL, InferenceResponse

_LOG = logging.getLogger("kvserve.host")


@dataclass(slots=True, frozen=True)
class Delivery:
    """One response as the transport sees it. `response`, `wire` and `error` all None
    means a flags-only FINAL (what `send(flags=FINAL)` produces). A stream's handle
    gives `wire` instead of `response`: the whole ModelStreamInferResponse, serialised."""

    response: pb.ModelInferResponse | None
    error: tuple[int, str] | None
    final: bool
    wire: bytes | None = None


class RequestHandle:
    def __init__(
        self,
        *,
        model_name: str,
        model_version: str,
        request_id: str,
        requested_filter: frozenset[str] | None,
        emit: Callable[[Delivery], None],
        metrics: HostMetrics,
        stream: bool = False,
    ) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.request_id = request_id
        self._requested = requested_filter
        self._emit = emit
        self._metrics = metrics
        # ModelStreamInfer: responses leave this thread as the bytes gRPC writes (stream_wire.py).
        self._id_wire = id_field(request_id) if stream else None
        self._cancelled = threading.Event()
        self._saw_error = False
        self._done = False
        self.start_ns = time.monotonic_ns()
        self.queue_us = 0.0  # set when an instance picks the request up

    # ---- ResponseSink ----

    def is_cancelled(self) -> bool:
        return self._cancelled.is_set()

    def deliver(self, response: InferenceResponse | None, flags: int) -> None:
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        failure: TritonModelException | None = None
        if response is None:
            item = Delivery(None, None, final)
        elif response.has_error():
            err = response.error()
            assert err is not None
            self._saw_error = True
            item = Delivery(None, (err.code(), err.message()), final)
        else:
            try:
                if self._id_wire is not None:
                    wire = encode_stream_response(response, model_name=self.model_name,
                                                  model_version=self.model_version, request_id=self.request_id,
                                                  id_wire=self._id_wire, requested_outputs=self._requested,
                                                  final=final)
                    item = Delivery(None, None, final, wire)
                else:
                    proto = encode_response(response, model_name=self.model_name, model_version=self.model_version,
                                            request_id=self.request_id, requested_outputs=self._requested)
                    item = Delivery(proto, None, final)
            except (TypeError, ValueError) as exc:
                # The client still gets a terminal answer; the model learns why its send failed.
                self._saw_error = True
                message = f"failed to serialise the response of model '{self.model_name}': {exc}"
                item = Delivery(None, (TritonError.INTERNAL, message), final)
                failure = TritonModelException(message)
        if final:
            self._finish()
        self._emit(item)
        if failure is not None:
            raise failure

    # ---- host side ----

    def cancel(self) -> None:
        """The client went away or cancelled: models see it through is_cancelled()."""
        self._cancelled.set()

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        reason = "CANCELED" if self.is_cancelled() else ("BACKEND" if self._saw_error else None)
        duration_us = (time.monotonic_ns() - self.start_ns) / 1000.0
        try:
            self._metrics.request_done(self.model_name, self.model_version, reason, duration_us, self.queue_us)
        except Exception:  # metrics must never break a response
            _LOG.exception("failed to record request metrics")
