"""`EmbeddingBackend` over KServe v2 gRPC: the embed model of tritonserver or the
embedded host, on the same kind of channel as the llm model's client.

The model is decoupled (its batching is its own), so a call is a
ModelStreamInfer stream carrying one request and answered by one FINAL
response. The tensor contract is model_repository/embed/config.pbtxt.
"""
from __future__ import annotations

import asyncio
import json
import struct
from typing import AsyncIterator

import grpc
from tritonclient.grpc import service_pb2

from kvserve.frontend.backend_client.grpc_codec import (EMPTY_FINAL_PARAM, _add_input, _bytes_tensor, classify_error,
                                                        is_final)
from kvserve.frontend.backend_client.protocol import (BackendError, BackendFailed, BackendRejected,
                                                      BackendUnavailable, EmbedRequest, EmbedResult)
from kvserve.frontend.backend_client.tracing_seam import GRPC_OK, start_client_span
from kvserve.frontend.backend_client.triton_client import TritonBackendClient
from kvserve.seam import embed_tensors as T

def build_embed_request(model_name: str, req: EmbedRequest) -> service_pb2.ModelInferRequest:
    msg = service_pb2.ModelInferRequest(model_name=model_name, id=req.request_id)
    if req.inputs and isinstance(req.inputs[0], str):
        texts = [t.encode("utf-8") for t in req.inputs]  # type: ignore[union-attr]
        _add_input(msg, T.TEXT_INPUT, "BYTES", [len(texts)], _bytes_tensor(texts))
    else:
        flat = [t for ids in req.inputs for t in ids]  # type: ignore[union-attr]
        _add_input(msg, T.INPUT_IDS, "INT32", [len(flat)], struct.pack(f"<{len(flat)}i", *flat))
        lens = [len(ids) for ids in req.inputs]
        _add_input(msg, T.INPUT_LENGTHS, "INT32", [len(lens)], struct.pack(f"<{len(lens)}i", *lens))
    if req.pooling:
        params = json.dumps(req.pooling, separators=(",", ":")).encode("utf-8")
        _add_input(msg, T.POOLING_PARAMETERS, "BYTES", [1], _bytes_tensor([params]))
    msg.parameters[EMPTY_FINAL_PARAM].bool_param = True
    return msg


def parse_embed_response(resp: service_pb2.ModelInferResponse) -> EmbedResult:
    raw = dict(zip((o.name for o in resp.outputs), resp.raw_output_contents))
    shapes = {o.name: list(o.shape) for o in resp.outputs}
    datatypes = {o.name: o.datatype for o in resp.outputs}
    if (datatypes.get(T.EMBEDDING) != "FP32" or len(shapes.get(T.EMBEDDING, [])) != 2
            or datatypes.get(T.PROMPT_TOKENS) != "INT32"):
        raise BackendFailed("the embed model's response lacks its FP32 [n, dim] embedding or its prompt_tokens")
    n, dim = shapes[T.EMBEDDING]
    data = raw[T.EMBEDDING]
    tokens = raw[T.PROMPT_TOKENS]
    if len(data) != 4 * n * dim or len(tokens) != 4 * n:
        raise BackendFailed("the embed model's tensors have the wrong size")
    row = 4 * dim
    return EmbedResult([data[i * row:(i + 1) * row] for i in range(n)], list(struct.unpack(f"<{n}i", tokens)))


def classify_embed_error(message: str) -> BackendError:
    """The model's error as the gateway's, its param in the client's terms: the
    tensors `input` became are called `input`, the pooling JSON is no field."""
    error = classify_error(message)
    if isinstance(error, BackendRejected):
        if error.param in T.INPUT_PARAMS:
            error.param = "input"
        elif error.param == T.POOLING_PARAMETERS:
            error.param = None
    return error


class TritonEmbeddingClient(TritonBackendClient):
    def __init__(self, url: str, *, model_name: str = "embed") -> None:
        super().__init__(url, model_name=model_name)

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        stub = self._get_stub()
        finished = asyncio.Event()
        span = start_client_span(self._url, self._model, request.request_id)
        infer_request = build_embed_request(self._model, request)
        for key, value in span.parameters(request.traceparent).items():
            infer_request.parameters[key].string_param = value

        async def outgoing() -> AsyncIterator[service_pb2.ModelInferRequest]:
            yield infer_request
            await finished.wait()  # our half stays open until the answer (see TritonBackendClient)

        call = stub.ModelStreamInfer(outgoing())
        result: EmbedResult | None = None
        grpc_code: int | None = None
        error: str | None = None
        try:
            async for message in call:
                if message.error_message:
                    error = message.error_message
                    raise classify_embed_error(message.error_message)
                if message.infer_response.outputs:
                    result = parse_embed_response(message.infer_response)
                if is_final(message.infer_response):
                    break
            if result is None:
                error = "no embeddings in the response"
                raise BackendFailed("the embed model ended the request without embeddings")
            grpc_code = GRPC_OK
            return result
        except grpc.aio.AioRpcError as exc:
            grpc_code, error = exc.code().value[0], exc.code().name
            raise BackendUnavailable(f"backend {self._url}: {exc.code().name}") from exc
        finally:
            span.end(grpc_code, error)
            finished.set()
            if result is None:
                call.cancel()  # an error, or the handler was cancelled: the model drops the request
            else:
                await self._finish(call)
