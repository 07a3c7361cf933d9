"""`BackendClient` over KServe v2 gRPC (tritonserver or the embedded host).

One gRPC stream per request, all on one shared channel (HTTP/2 multiplexes the
streams over one connection). Why not one long-lived stream with requests
multiplexed by id:
- cancellation: KServe has no "cancel request X" message. The only way to
  cancel one in-flight request is to cancel the RPC that carries it; on a
  shared stream that would cancel every request on it;
- errors: a stream error carries no reliable request id, so on a shared stream
  the gateway could not tell whose request failed;
- a stream-level failure (server restart) hits one request, not all of them.
The cost is an HTTP/2 stream per request, which is what gRPC is built for.

We build the protobufs ourselves from tritonclient's generated stubs instead of
calling `tritonclient.grpc.aio.InferenceServerClient.stream_infer`: that method
cannot set `triton_enable_empty_final_response` (a reserved parameter it
refuses), and without it a model that ends a request with a flags-only FINAL
response would never tell us the request is over.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Callable

import aiohttp
import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from kvserve.frontend.backend_client.grpc_codec import (build_describe_request, build_engine_control_request,
                                                       build_lora_control_request, build_request, classify_error,
                                                       is_final, parse_engine_answer, parse_lora_listing,
                                                       parse_model_facts, parse_response)
from kvserve.frontend.backend_client.protocol import (BackendFailed, BackendUnavailable, ChoiceDelta, GenerateRequest,
                                                     LoRAAdapterInfo, ModelFacts)
from kvserve.frontend.backend_client.tracing_seam import GRPC_CANCELLED, GRPC_OK, start_client_span

log = logging.getLogger("kvserve.frontend.triton")

_MAX_MESSAGE = 2**31 - 1
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    # Detect a dead backend within ~20 s even on idle connections.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # Current gRPC core waits this long for a keepalive ping's ack, whatever
    # keepalive_timeout says (default 60 s; measured with grpcio 1.85): without
    # it a silent (stopped, partitioned) peer fails its streams only after a minute.
    ("grpc.http2.ping_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect to a restarted backend within seconds (gRPC's default backoff
    # grows to 2 minutes), so a replica's health check can pass again soon.
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]
_HEALTH_TIMEOUT_S = 2.0
_LORA_TIMEOUT_S = 120.0  # a load reads and checks the adapter's files
_ENGINE_CONTROL_TIMEOUT_S = 30.0  # it waits for the engine's step in progress (a long prefill)
_CLOSE_GRACE_S = 1.0


class TritonBackendClient:
    def __init__(self, url: str, *, model_name: str = "llm", metrics_url: str | None = None) -> None:
        self.name = url
        self._url = url
        self._model = model_name
        self._metrics_url = metrics_url
        self._channel: grpc.aio.Channel | None = None
        self._stub: service_pb2_grpc.GRPCInferenceServiceStub | None = None
        self._http: aiohttp.ClientSession | None = None

    def _get_stub(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        # Created lazily: a grpc.aio channel binds to the running event loop.
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self._url, options=_CHANNEL_OPTIONS)
            self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        return self._stub

    async def ready(self) -> bool:
        stub = self._get_stub()
        try:
            server = await stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=_HEALTH_TIMEOUT_S)
            if not server.ready:
                return False
            model = await stub.ModelReady(service_pb2.ModelReadyRequest(name=self._model), timeout=_HEALTH_TIMEOUT_S)
            return bool(model.ready)
        except grpc.aio.AioRpcError:
            return False

    async def describe(self) -> ModelFacts | None:
        """One describe request (seam.tensors.DESCRIBE_PARAM) on its own stream."""
        stub = self._get_stub()
        request = build_describe_request(self._model)

        async def outgoing() -> AsyncIterator[service_pb2.ModelInferRequest]:
            yield request

        call = stub.ModelStreamInfer(outgoing(), timeout=_HEALTH_TIMEOUT_S)
        try:
            async for message in call:
                if message.error_message:  # a model that predates the question treats it as a prompt
                    return None
                return parse_model_facts(message.infer_response)
        except grpc.aio.AioRpcError as exc:  # no answer at all: the caller asks again later
            raise BackendUnavailable(f"describe failed: {exc.code().name}") from None
        finally:
            call.cancel()
        return None

    async def lora_control(self, action: str, lora_name: str | None = None,
                           lora_path: str | None = None) -> list[LoRAAdapterInfo]:
        """One LoRA control request (seam.tensors.LORA_CONTROL_PARAM) on its own stream."""
        request = build_lora_control_request(self._model, action, lora_name, lora_path)
        return await self._control(request, _LORA_TIMEOUT_S if action == "load" else _HEALTH_TIMEOUT_S * 5,
                                   parse_lora_listing, f"LoRA {action}", "manage LoRA adapters")

    async def engine_control(self, action: str) -> dict[str, Any]:
        """One engine control request (seam.tensors.ENGINE_CONTROL_PARAM) on its own stream."""
        return await self._control(build_engine_control_request(self._model, action), _ENGINE_CONTROL_TIMEOUT_S,
                                   parse_engine_answer, action, "take engine control requests")

    async def _control(self, request: service_pb2.ModelInferRequest, timeout: float,
                       parse: Callable[[service_pb2.ModelInferResponse], Any], what: str, ability: str) -> Any:
        """A control request's one answer, as `parse` reads it; its refusal as the backend's error."""
        stub = self._get_stub()

        async def outgoing() -> AsyncIterator[service_pb2.ModelInferRequest]:
            yield request

        call = stub.ModelStreamInfer(outgoing(), timeout=timeout)
        try:
            async for message in call:
                if message.error_message:
                    raise classify_error(message.error_message)
                answer = parse(message.infer_response)
                if answer is None:
                    raise BackendFailed(f"the backend's model does not {ability}")
                return answer
        except grpc.aio.AioRpcError as exc:
            raise BackendUnavailable(f"{what} failed: {exc.code().name}") from None
        finally:
            call.cancel()
        raise BackendUnavailable(f"{what}: no answer")

    async def generate(self, request: GenerateRequest) -> AsyncIterator[ChoiceDelta]:
        stub = self._get_stub()
        finished = asyncio.Event()
        # A CLIENT span around the call; its traceparent (not the server span's) goes to the backend.
        span = start_client_span(self._url, self._model, request.request_id)
        infer_request = build_request(self._model, request)
        for key, value in span.parameters(request.traceparent).items():
            infer_request.parameters[key].string_param = value

        async def outgoing() -> AsyncIterator[service_pb2.ModelInferRequest]:
            yield infer_request
            # Keep our half of the stream open until the final response: a server
            # that ends the RPC on the client's half-close could otherwise drop
            # responses still in flight.
            await finished.wait()

        call = stub.ModelStreamInfer(outgoing())
        complete = False
        grpc_code: int | None = None
        error: str | None = None
        try:
            async for message in call:
                if message.error_message:
                    error = message.error_message
                    raise classify_error(message.error_message)
                complete = is_final(message.infer_response)
                delta = parse_response(message.infer_response)
                if delta is not None:
                    yield delta
                if complete:
                    break
            else:
                complete = True  # the server ended the stream: nothing more will come
        except grpc.aio.AioRpcError as exc:
            grpc_code, error = exc.code().value[0], exc.code().name
            raise BackendUnavailable(f"backend {self._url}: {exc.code().name}") from exc
        finally:
            if grpc_code is None and error is None:
                grpc_code = GRPC_OK if complete else GRPC_CANCELLED
            span.end(grpc_code, error)
            if complete:
                finished.set()
                await self._finish(call)
            else:
                # Client went away, the handler was cancelled, or an error: cancelling
                # the RPC is what tells the server to abort the request now.
                call.cancel()
                finished.set()

    async def _finish(self, call: grpc.aio.StreamStreamCall) -> None:
        try:
            await asyncio.wait_for(call.code(), _CLOSE_GRACE_S)
        except (asyncio.TimeoutError, grpc.aio.AioRpcError):
            call.cancel()

    async def metrics_text(self) -> str:
        if not self._metrics_url:
            return ""
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_HEALTH_TIMEOUT_S))
        try:
            async with self._http.get(self._metrics_url) as resp:
                return await resp.text() if resp.status == 200 else ""
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            log.warning("cannot scrape backend metrics %s: %s", self._metrics_url, exc)
            return ""

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None
