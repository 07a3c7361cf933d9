"""TritonBackendClient against an in-process KServe v2 gRPC server: the tensor
contract, end-of-request detection, errors, and cancellation."""
from __future__ import annotations

import asyncio
import json
import struct

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from gw_triton_fakes import FakeTriton, input_raw, make_response

from kvserve.frontend.backend_client.grpc_codec import build_request, classify_error, parse_response
from kvserve.frontend.backend_client.protocol import BackendFailed, BackendRejected, BackendUnavailable, GenerateRequest
from kvserve.frontend.backend_client.triton_client import TritonBackendClient
from kvserve.seam.error_wire import ErrorKind, WireError


async def _with_server(body):
    server = grpc.aio.server()
    fake = FakeTriton()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = TritonBackendClient(f"127.0.0.1:{port}")
    try:
        return await body(client, fake)
    finally:
        await client.close()
        await server.stop(0)


def run(body):
    return asyncio.run(_with_server(body))


def test_build_request_follows_the_tensor_contract() -> None:
    msg = build_request("llm", GenerateRequest("r-0", [1, 2, 300], {"n": 2, "stop": ["x"]}, stream=False,
                                               traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01"))
    assert msg.model_name == "llm" and msg.id == "r-0"
    names = {t.name: (t.datatype, list(t.shape)) for t in msg.inputs}
    assert names == {"input_ids": ("INT32", [3]), "sampling_parameters": ("BYTES", [1]), "stream": ("BOOL", [1])}
    assert struct.unpack("<3i", input_raw(msg, "input_ids")) == (1, 2, 300)
    assert json.loads(input_raw(msg, "sampling_parameters")[4:]) == {"n": 2, "stop": ["x"]}
    assert input_raw(msg, "stream") == b"\x00"
    assert msg.parameters["triton_enable_empty_final_response"].bool_param is True
    assert msg.parameters["traceparent"].string_param.startswith("00-aaaa")
    text = build_request("llm", GenerateRequest("r-1", "héllo", {}))
    assert input_raw(text, "text_input") == struct.pack("<I", 6) + "héllo".encode()


def test_parse_response() -> None:
    delta = parse_response(make_response("r", "ab", [5, 6], finish="length", index=1, done=7,
                                         logprobs=[(5, -1.0, [(8, -2.5), (9, -3.0)]), (6, -0.5, [(6, -0.5), (2, -4.0)])]))
    assert (delta.index, delta.text, delta.token_ids, delta.finish_reason) == (1, "ab", [5, 6], "length")
    assert (delta.prompt_tokens, delta.completion_tokens, delta.cached_tokens) == (4, 7, 2)
    assert [(e.token_id, e.logprob, [(t.token_id, t.logprob) for t in e.top_logprobs]) for e in delta.logprobs] == \
        [(5, -1.0, [(8, -2.5), (9, -3.0)]), (6, -0.5, [(6, -0.5), (2, -4.0)])]
    assert parse_response(make_response("r", "", [], finish="")).finish_reason is None
    assert parse_response(service_pb2.ModelInferResponse()) is None


def test_parse_response_typed_contents_and_other_int_types() -> None:
    """A KServe server may send typed `contents` instead of raw bytes, and INT64
    where we send INT32; a missing optional output reads as empty/zero."""
    resp = service_pb2.ModelInferResponse(model_name="llm", id="r")
    for name, dtype, field, values in [("text_output", "BYTES", "bytes_contents", ["hé".encode()]),
                                       ("output_ids", "INT64", "int64_contents", [7, 8]),
                                       ("finish_reason", "BYTES", "bytes_contents", [b"stop"]),
                                       ("index", "INT32", "int_contents", [2])]:
        out = resp.outputs.add(name=name, datatype=dtype)
        out.shape.append(len(values))
        getattr(out.contents, field).extend(values)
    delta = parse_response(resp)
    assert (delta.index, delta.text, delta.token_ids, delta.finish_reason) == (2, "hé", [7, 8], "stop")
    assert (delta.prompt_tokens, delta.completion_tokens, delta.cached_tokens, delta.logprobs) == (0, 0, 0, None)
    raw = make_response("r", "x", [])
    raw.outputs[1].datatype = "INT64"
    raw.raw_output_contents[1] = struct.pack("<2q", 2**40, -1)
    assert parse_response(raw).token_ids == [2**40, -1]


def test_classify_engine_errors() -> None:
    """The kind and field come from the wire header (kvserve.seam.error_wire), wherever the server put it."""
    def wire(kind, message, param=None):
        return WireError(kind, message, param).format()
    e = classify_error(wire(ErrorKind.INVALID, "max_tokens: must be an integer >= 1, got 0", "max_tokens"))
    assert isinstance(e, BackendRejected) and e.param == "max_tokens"
    e = classify_error("Failed to process the request(s) for model 'llm', message: "
                       + wire(ErrorKind.INVALID, "top_p: bad", "top_p"))
    assert isinstance(e, BackendRejected) and e.param == "top_p" and e.message == "top_p: bad"
    e = classify_error(wire(ErrorKind.CONTEXT_LENGTH, "context_length_exceeded: prompt (90 tokens) + max_tokens (20)",
                            "prompt"))
    assert isinstance(e, BackendRejected) and e.kind is ErrorKind.CONTEXT_LENGTH
    assert classify_error(wire(ErrorKind.OVERLOADED, "unavailable: the waiting queue is full (8 requests)")).overloaded
    assert classify_error(wire(ErrorKind.TIMEOUT, "timeout: the request did not finish within 1.0 s")).kind \
        is ErrorKind.TIMEOUT
    assert isinstance(classify_error(wire(ErrorKind.INTERNAL, "internal error: the engine step failed")), BackendFailed)
    # Without the header it is the server's own failure, whatever the words say.
    assert isinstance(classify_error("max_tokens: must be an integer >= 1, got 0"), BackendFailed)
    assert isinstance(classify_error("CUDA error: out of memory"), BackendFailed)


def test_generate_reads_until_the_final_response() -> None:
    async def body(client, fake):
        assert await client.ready()
        deltas = [d async for d in client.generate(GenerateRequest("r-1", "ok", {"n": 1}))]
        assert [(d.text, d.finish_reason) for d in deltas] == [("Hel", None), ("lo", "stop")]
        assert deltas[1].logprobs[0].top_logprobs[0].token_id == 9
        # A flags-only FINAL (empty response) also ends the request.
        deltas = [d async for d in client.generate(GenerateRequest("r-2", "empty-final", {}))]
        assert len(deltas) == 2
        assert [r.id for r in fake.requests] == ["r-1", "r-2"]
        assert not fake.cancelled.is_set()
    run(body)


def test_stream_error_becomes_backend_rejected() -> None:
    async def body(client, fake):
        with pytest.raises(BackendRejected) as info:
            [d async for d in client.generate(GenerateRequest("r", "error", {}))]
        assert info.value.param == "max_tokens"
    run(body)


def test_closing_the_iterator_cancels_the_rpc_at_once() -> None:
    async def body(client, fake):
        stream = client.generate(GenerateRequest("r", "slow", {}))
        got = [await stream.__anext__() for _ in range(3)]
        assert [d.text for d in got] == ["t0", "t1", "t2"]
        await stream.aclose()
        await asyncio.wait_for(fake.cancelled.wait(), 1.0)
    run(body)


def test_cancelling_the_consumer_task_cancels_the_rpc() -> None:
    async def body(client, fake):
        async def consume():
            async for _ in client.generate(GenerateRequest("r", "slow", {})):
                pass
        task = asyncio.create_task(consume())
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.wait_for(fake.cancelled.wait(), 1.0)
    run(body)


def test_unreachable_backend() -> None:
    async def body():
        client = TritonBackendClient("127.0.0.1:1")
        try:
            assert not await client.ready()
            with pytest.raises(BackendUnavailable):
                [d async for d in client.generate(GenerateRequest("r", "ok", {}))]
        finally:
            await client.close()
    asyncio.run(body())
