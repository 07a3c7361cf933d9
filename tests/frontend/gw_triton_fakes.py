"""An in-process KServe v2 gRPC server that speaks the llm model's tensor
contract, for TritonBackendClient tests and the `kvserve serve --triton-url` test.

Its text prompt picks the behaviour: "error" -> stream error, "slow" -> endless
tokens (records cancellation), "empty-final" -> a flags-only FINAL response;
anything else -> "Hel" + "lo" with the final flag on the last response.
"""
from __future__ import annotations

import asyncio
import struct

from tritonclient.grpc import service_pb2, service_pb2_grpc

from kvserve.seam.error_wire import ErrorKind, WireError


def _bytes_raw(*values: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def make_response(rid: str, text: str, ids: list[int], finish: str = "", index: int = 0, done: int = 1,
                  final: bool = False, logprobs: list | None = None) -> service_pb2.ModelInferResponse:
    resp = service_pb2.ModelInferResponse(model_name="llm", id=rid)
    outputs = [
        ("text_output", "BYTES", [1], _bytes_raw(text.encode())),
        ("output_ids", "INT32", [len(ids)], struct.pack(f"<{len(ids)}i", *ids)),
        ("finish_reason", "BYTES", [1], _bytes_raw(finish.encode())),
        ("index", "INT32", [1], struct.pack("<i", index)),
        ("prompt_tokens", "INT32", [1], struct.pack("<i", 4)),
        ("completion_tokens", "INT32", [1], struct.pack("<i", done)),
        ("cached_tokens", "INT32", [1], struct.pack("<i", 2)),
    ]
    if logprobs is not None:  # [(token_id, logprob, [(top id, top logprob), ...]), ...], k tops each
        rows = [[(token_id, lp), *top] for token_id, lp, top in logprobs]
        shape = [len(rows), len(rows[0]) if rows else 1]
        flat = [pair for row in rows for pair in row]
        outputs.append(("logprob_ids", "INT32", shape, struct.pack(f"<{len(flat)}i", *(i for i, _ in flat))))
        outputs.append(("logprob_values", "FP32", shape, struct.pack(f"<{len(flat)}f", *(v for _, v in flat))))
    for name, dtype, shape, raw in outputs:
        out = resp.outputs.add()
        out.name, out.datatype = name, dtype
        out.shape.extend(shape)
        resp.raw_output_contents.append(raw)
    resp.parameters["triton_final_response"].bool_param = final
    return resp


def input_raw(req: service_pb2.ModelInferRequest, name: str) -> bytes | None:
    for i, t in enumerate(req.inputs):
        if t.name == name:
            return req.raw_input_contents[i]
    return None


class FakeTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[service_pb2.ModelInferRequest] = []
        self.cancelled = asyncio.Event()
        self.ready = True

    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=self.ready)

    async def ModelReady(self, request, context):
        return service_pb2.ModelReadyResponse(ready=request.name == "llm")

    async def ModelStreamInfer(self, request_iterator, context):
        async for req in request_iterator:
            self.requests.append(req)
            raw = input_raw(req, "text_input")
            mode = raw[4:].decode() if raw else "ids"
            rid = req.id
            if mode == "error":
                yield service_pb2.ModelStreamInferResponse(
                    error_message="in ensemble 'llm', " + WireError(ErrorKind.INVALID, "max_tokens: must be an integer >= 1, got 0", "max_tokens").format())
                continue
            if mode == "slow":
                try:
                    for k in range(10_000):
                        yield service_pb2.ModelStreamInferResponse(infer_response=make_response(rid, f"t{k}", [k]))
                        await asyncio.sleep(0.02)
                except asyncio.CancelledError:
                    self.cancelled.set()
                    raise
                continue
            yield service_pb2.ModelStreamInferResponse(infer_response=make_response(rid, "Hel", [1, 2]))
            last = make_response(rid, "lo", [3], finish="stop", done=3, final=(mode != "empty-final"),
                                 logprobs=[(3, -0.5, [(9, -2.0)])])
            yield service_pb2.ModelStreamInferResponse(infer_response=last)
            if mode == "empty-final":
                empty = service_pb2.ModelInferResponse(model_name="llm", id=rid)
                empty.parameters["triton_final_response"].bool_param = True
                yield service_pb2.ModelStreamInferResponse(infer_response=empty)
