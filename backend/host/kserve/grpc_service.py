"""GRPCInferenceService (KServe v2) served with grpc.aio, as tritonserver serves it.

Health, metadata, config, the repository RPCs and ModelInfer live here;
ModelStreamInfer is in grpc_stream. RepositoryModelLoad / RepositoryModelUnload
work as in tritonserver with --model-control-mode=explicit (the repository does
the work) and answer UNAVAILABLE in mode none. The other RPCs (statistics,
shared memory, tracing, logging) answer UNIMPLEMENTED, saying that this host
leaves them out, without an error line in the host's log for each call.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Coroutine

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from ..infer_errors import InferError, grpc_status
from .grpc_stream import StreamSession
from ..host_metrics import HostMetrics
from tritonclient.grpc import model_config_pb2 as mc
from ..pb_utils.dtypes import CONFIG_TO_WIRE
from ..pb_utils.triton_errors import TritonError
from ..pb_utils.inference_request import new_server_request
from ..repository import ModelRepository, parse_version
from ..request_handle import Delivery, RequestHandle
from .raw_requests import DecodeError, parse_message
from .request_parse import parse_request_async

SERVER_NAME = "triton"
SERVER_VERSION = "kvserve-embedded-host"
EXTENSIONS = ["model_configuration", "parameters"]


def _tensor_metadata(io: mc.ModelInput | mc.ModelOutput, batched: bool) -> pb.ModelMetadataResponse.TensorMetadata:
    shape = ([-1] if batched else []) + [int(d) for d in io.dims]
    return pb.ModelMetadataResponse.TensorMetadata(
        name=io.name, datatype=CONFIG_TO_WIRE.get(mc.DataType.Name(io.data_type), "INVALID"), shape=shape)


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, repository: ModelRepository, metrics: HostMetrics, strict_readiness: bool = True) -> None:
        self._repo = repository
        self._metrics = metrics
        self._strict = strict_readiness
        self.shutting_down = False

    def server_ready(self) -> bool:
        return not self.shutting_down and (self._repo.all_ready() if self._strict else True)

    async def ServerLive(self, request: pb.ServerLiveRequest,
                         context: grpc.aio.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest,
                          context: grpc.aio.ServicerContext) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.server_ready())

    async def ModelReady(self, request: pb.ModelReadyRequest,
                         context: grpc.aio.ServicerContext) -> pb.ModelReadyResponse:
        if request.version:
            try:
                parse_version(request.version)  # a malformed version is an error, as in tritonserver
            except InferError as exc:
                await context.abort(exc.grpc_code, exc.message)
        return pb.ModelReadyResponse(ready=self._repo.model_ready(request.name, request.version))

    async def ServerMetadata(self, request: pb.ServerMetadataRequest,
                             context: grpc.aio.ServicerContext) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=SERVER_VERSION, extensions=EXTENSIONS)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
        runtime = await self._lookup(request.name, request.version, context)
        config = runtime.config
        versions = [request.version] if request.version else \
            [str(v) for v in self._repo.entries[runtime.name].ready_versions()]
        batched = config.max_batch_size > 0
        return pb.ModelMetadataResponse(
            name=runtime.name, versions=versions, platform=config.platform or config.backend,
            inputs=[_tensor_metadata(i, batched) for i in config.input],
            outputs=[_tensor_metadata(o, batched) for o in config.output])

    async def ModelConfig(self, request: pb.ModelConfigRequest,
                          context: grpc.aio.ServicerContext) -> pb.ModelConfigResponse:
        runtime = await self._lookup(request.name, request.version, context)
        return pb.ModelConfigResponse(config=runtime.config)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                              context: grpc.aio.ServicerContext) -> pb.RepositoryIndexResponse:
        models = [pb.RepositoryIndexResponse.ModelIndex(name=n, version=v, state=s, reason=r)
                  for n, v, s, r in self._repo.index() if not request.ready or s == "READY"]
        return pb.RepositoryIndexResponse(models=models)

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: grpc.aio.ServicerContext) -> pb.RepositoryModelLoadResponse:
        if request.parameters and self._repo.explicit_control:
            # tritonserver can load a config or files sent with the request; this host loads the
            # repository's own, and says so rather than serve something else than was asked.
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                f"failed to load '{request.model_name}': load parameters (config, file "
                                "content) are not supported by kvserve's embedded host")
        await self._model_control(self._repo.load_model(request.model_name), context)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: grpc.aio.ServicerContext) -> pb.RepositoryModelUnloadResponse:
        # `unload_dependents` needs no handling: Python-backend models have no dependents here.
        await self._model_control(self._repo.unload_model(request.model_name), context)
        return pb.RepositoryModelUnloadResponse()

    async def ModelInfer(self, data: bytes, context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        try:
            request = await parse_message(data)
        except DecodeError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed ModelInferRequest")
        runtime = await self._lookup(request.model_name, request.model_version, context)
        try:
            if runtime.decoupled:
                raise InferError(TritonError.UNSUPPORTED,
                                 "ModelInfer RPC doesn't support models with decoupled transaction policy")
            parsed = await parse_request_async(request, runtime.config)
        except InferError as exc:
            await context.abort(exc.grpc_code, exc.message)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Delivery | None] = loop.create_future()
        last: list[Delivery] = []

        def on_delivery(d: Delivery) -> None:  # on the loop
            if d.response is not None or d.error is not None:
                last[:] = [d]
            if d.final and not answer.done():
                answer.set_result(last[0] if last else None)

        def emit(d: Delivery) -> None:  # any thread
            try:
                loop.call_soon_threadsafe(on_delivery, d)
            except RuntimeError:
                pass  # loop closed during shutdown

        handle = RequestHandle(model_name=runtime.name, model_version=runtime.version_str, request_id=request.id,
                               requested_filter=parsed.requested_filter, emit=emit, metrics=self._metrics)
        model_request = new_server_request(
            request_id=parsed.request_id, correlation_id=parsed.correlation_id, inputs=parsed.inputs,
            requested_output_names=parsed.requested_output_names, model_name=runtime.name,
            model_version=runtime.version, flags=parsed.flags, timeout=parsed.timeout,
            parameters=parsed.parameters, sink=handle, decoupled=False)
        try:
            runtime.submit(model_request, handle)
            result = await answer
        except InferError as exc:
            await context.abort(exc.grpc_code, exc.message)
        except asyncio.CancelledError:
            handle.cancel()  # the client cancelled or went away
            raise
        if result is None:
            await context.abort(grpc.StatusCode.INTERNAL, "the model completed the request without a response")
        if result.error is not None:
            await context.abort(grpc_status(result.error[0]), result.error[1])
        assert result.response is not None
        return result.response

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[bytes],
                               context: grpc.aio.ServicerContext) -> None:
        await StreamSession(self._repo, self._metrics, request_iterator, context).run()

    async def _model_control(self, work: Coroutine[Any, Any, None], context: grpc.aio.ServicerContext) -> None:
        try:
            await work
        except InferError as exc:
            await context.abort(exc.grpc_code, exc.message)

    async def _lookup(self, name: str, version: str, context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
        try:
            return self._repo.lookup(name, version)
        except InferError as exc:
            await context.abort(exc.grpc_code, exc.message)


UNIMPLEMENTED_RPCS = (
    "ModelStatistics", "SystemSharedMemoryStatus",
    "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister", "CudaSharedMemoryStatus",
    "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister", "TraceSetting", "LogSettings",
)


def _unimplemented(name: str):  # type: ignore[no-untyped-def]
    async def rpc(self: InferenceServicer, request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            f"{name} is not implemented by kvserve's embedded host (tritonserver has it)")
    rpc.__name__ = name
    return rpc


for _name in UNIMPLEMENTED_RPCS:
    setattr(InferenceServicer, _name, _unimplemented(_name))
