"""ModelStreamInfer: many requests multiplexed on one bidirectional stream.

Behaviour follows tritonserver's ModelStreamInferHandler:
- every response carries the request `id`, and the `triton_final_response`
  bool parameter saying whether it completed its request;
- a flags-only FINAL from a decoupled model becomes an empty response only if
  the request set `triton_enable_empty_final_response`;
- errors travel in `error_message`, on that request only; the stream goes on;
- non-decoupled responses are written in request order, decoupled ones as sent;
- the RPC ends OK once the client has half-closed and every request finished.
If the client cancels (or the stream breaks), every request still in flight on
the stream is marked cancelled, which models observe through is_cancelled().
"""
from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass
from typing import AsyncIterator

import grpc
from tritonclient.grpc import service_pb2 as pb

from ..infer_errors import InferError
from .loop_handoff import handoff_for
from ..host_metrics import HostMetrics
from ..pb_utils.triton_errors import TritonError
from ..pb_utils.inference_request import new_server_request
from ..repository import ModelRepository
from ..request_handle import Delivery, RequestHandle
from .raw_requests import DecodeError, parse_message
from .request_parse import parse_request_async

_LOG = logging.getLogger("kvserve.host")
FINAL_PARAM = "triton_final_response"
_END = object()


@dataclass(slots=True)
class _Slot:
    """Where a non-decoupled response waits until the ones before it are written."""

    response: pb.ModelStreamInferResponse | bytes | None = None
    done: bool = False  # done without a response: skipped, so it cannot block the ones behind it


@dataclass(slots=True)
class _Entry:
    slot: _Slot | None  # None for decoupled requests: their responses go out as sent
    empty_final: bool  # the client asked for empty final responses (decoupled only)


class StreamSession:
    def __init__(self, repository: ModelRepository, metrics: HostMetrics,
                 request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        self._repo = repository
        self._metrics = metrics
        self._requests = request_iterator
        self._context = context
        self._loop = asyncio.get_running_loop()
        self._handoff = handoff_for(self._loop)
        self._out: asyncio.Queue[object] = asyncio.Queue()  # messages, or bytes (the serializer passes them)
        self._inflight: dict[RequestHandle, _Entry] = {}
        self._ordered: collections.deque[_Slot] = collections.deque()
        self._reading = True

    async def run(self) -> None:
        reader = asyncio.create_task(self._read())
        try:
            while (item := await self._out.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                await self._context.write(item)
        finally:
            reader.cancel()
            if self._inflight:
                _LOG.debug("stream closed with %d request(s) in flight: cancelling them", len(self._inflight))
            for handle in list(self._inflight):
                handle.cancel()

    # ---- requests ----

    async def _read(self) -> None:
        try:
            async for data in self._requests:
                try:
                    request = await parse_message(data)
                except DecodeError:
                    self._issue_error(pb.ModelInferRequest(), InferError(TritonError.INVALID_ARG,
                                                                         "malformed ModelInferRequest"), None)
                    continue
                await self._start(request)  # one at a time: non-decoupled answers keep request order
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a broken stream ends the RPC, cancelling what is in flight
            self._out.put_nowait(exc)
            return
        self._reading = False
        self._maybe_end()

    async def _start(self, request: pb.ModelInferRequest) -> None:
        slot: _Slot | None = None
        try:
            runtime = self._repo.lookup(request.model_name, request.model_version)
            if not runtime.decoupled:
                slot = _Slot()
                self._ordered.append(slot)
            parsed = await parse_request_async(request, runtime.config)  # a host bug costs this request only
        except InferError as exc:
            self._issue_error(request, exc, slot)
            return
        handle = RequestHandle(model_name=runtime.name, model_version=runtime.version_str,
                               request_id=request.id, requested_filter=parsed.requested_filter,
                               emit=lambda d: self._emit(handle, d), metrics=self._metrics, stream=True)
        self._inflight[handle] = _Entry(slot, parsed.enable_empty_final_response and runtime.decoupled)
        model_request = new_server_request(
            request_id=parsed.request_id, correlation_id=parsed.correlation_id, inputs=parsed.inputs,
            requested_output_names=parsed.requested_output_names, model_name=runtime.name,
            model_version=runtime.version, flags=parsed.flags, timeout=parsed.timeout,
            parameters=parsed.parameters, sink=handle, decoupled=runtime.decoupled)
        try:
            runtime.submit(model_request, handle)
        except InferError as exc:
            del self._inflight[handle]
            self._issue_error(request, exc, slot)

    def _issue_error(self, request: pb.ModelInferRequest, exc: InferError, slot: _Slot | None) -> None:
        # As tritonserver: the error and the request id, no final-response parameter.
        response = pb.ModelStreamInferResponse(error_message=exc.message,
                                               infer_response=pb.ModelInferResponse(id=request.id))
        self._write(response, slot)
        self._maybe_end()

    # ---- responses (any thread -> loop) ----

    def _emit(self, handle: RequestHandle, delivery: Delivery) -> None:
        try:
            self._handoff.submit(self._on_delivery, handle, delivery)
        except RuntimeError:
            pass  # the loop is gone: the host is shutting down and nobody is listening

    def _on_delivery(self, handle: RequestHandle, delivery: Delivery) -> None:
        if handle not in self._inflight:
            return  # the stream already ended
        entry = self._inflight[handle]
        response = delivery.wire  # the usual case: serialised by the model's thread, FINAL parameter included
        if response is None:
            response = self._to_stream_response(handle, delivery, entry.empty_final)
        if delivery.final:
            del self._inflight[handle]
        if response is not None:
            self._write(response, entry.slot)
        elif delivery.final and entry.slot is not None:
            entry.slot.done = True
            self._flush()
        self._maybe_end()

    def _to_stream_response(self, handle: RequestHandle, d: Delivery,
                            empty_final: bool) -> pb.ModelStreamInferResponse | None:
        if d.error is not None:
            infer = pb.ModelInferResponse(id=handle.request_id, model_name=handle.model_name,
                                          model_version=handle.model_version)
            infer.parameters[FINAL_PARAM].bool_param = d.final
            return pb.ModelStreamInferResponse(error_message=d.error[1], infer_response=infer)
        if d.response is None:
            if not (d.final and empty_final):
                return None
            infer = pb.ModelInferResponse(id=handle.request_id, model_name=handle.model_name,
                                          model_version=handle.model_version)
        else:
            infer = d.response
        infer.parameters[FINAL_PARAM].bool_param = d.final
        return pb.ModelStreamInferResponse(infer_response=infer)

    def _write(self, response: pb.ModelStreamInferResponse | bytes, slot: _Slot | None) -> None:
        if slot is None:
            self._out.put_nowait(response)
            return
        slot.response, slot.done = response, True
        self._flush()

    def _flush(self) -> None:
        while self._ordered and self._ordered[0].done:
            response = self._ordered.popleft().response
            if response is not None:
                self._out.put_nowait(response)

    def _maybe_end(self) -> None:
        if not self._reading and not self._inflight and not self._ordered:
            self._out.put_nowait(_END)
