"""ModelStreamInfer: decoupled streaming, final flags, empty finals, multiplexing,
concurrency and client cancellation, through tritonclient (sync and aio) and the raw stub."""
from __future__ import annotations

import asyncio
import queue
import time
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from host_fixtures import metric_value, metrics_text
from tritonclient.grpc import service_pb2, service_pb2_grpc

from kvserve.backend.host import HostHandle


def repeat_inputs(n: int, delay: float | None = None, final_with_data: bool | None = None,
                  module: Any = grpcclient) -> list[Any]:
    inputs = [module.InferInput("IN", [1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([n], dtype=np.int32))
    if delay is not None:
        inputs.append(module.InferInput("DELAY", [1], "FP32"))
        inputs[-1].set_data_from_numpy(np.array([delay], dtype=np.float32))
    if final_with_data is not None:
        inputs.append(module.InferInput("FINAL_WITH_DATA", [1], "BOOL"))
        inputs[-1].set_data_from_numpy(np.array([final_with_data]))
    return inputs


def is_final(result: Any) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def run_sync_stream(host: HostHandle, requests: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    """Send all requests on one stream, half-close, and return every (result, error).

    stop_stream() without cancel waits until the server ends the RPC, which it
    does only after every request finished, so nothing can arrive later."""
    client = grpcclient.InferenceServerClient(host.grpc_url)
    received: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: received.put((result, error)))
    for kwargs in requests:
        client.async_stream_infer(**kwargs)
    client.stop_stream()
    client.close()
    return [received.get_nowait() for _ in range(received.qsize())]


def wait_for(predicate: Any, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"condition not met within {timeout}s")


def test_stream_yields_n_responses_and_exactly_one_final(host: HostHandle) -> None:
    out = run_sync_stream(host, [dict(model_name="repeat", inputs=repeat_inputs(5, final_with_data=True),
                                      request_id="five")])
    assert all(error is None for _, error in out)
    assert [int(r.as_numpy("IDX")[0]) for r, _ in out] == [0, 1, 2, 3, 4]
    assert [is_final(r) for r, _ in out] == [False, False, False, False, True]
    assert {r.get_response().id for r, _ in out} == {"five"}


def test_flags_only_final_is_dropped_unless_requested(host: HostHandle) -> None:
    plain = run_sync_stream(host, [dict(model_name="repeat", inputs=repeat_inputs(3), request_id="p")])
    assert [int(r.as_numpy("IDX")[0]) for r, _ in plain] == [0, 1, 2]
    assert not any(is_final(r) for r, _ in plain)  # the flags-only FINAL is not delivered by default

    asked = run_sync_stream(host, [dict(model_name="repeat", inputs=repeat_inputs(3), request_id="e",
                                        enable_empty_final_response=True)])
    assert len(asked) == 4 and [is_final(r) for r, _ in asked] == [False, False, False, True]
    empty = asked[-1][0].get_response()
    assert len(empty.outputs) == 0 and empty.id == "e" and empty.model_name == "repeat"

    # A data response that carries FINAL needs no extra empty response even when asked.
    data_final = run_sync_stream(host, [dict(model_name="repeat", inputs=repeat_inputs(2, final_with_data=True),
                                             request_id="d", enable_empty_final_response=True)])
    assert [is_final(r) for r, _ in data_final] == [False, True]


def test_multiplexed_requests_keep_ids_and_errors_stay_on_their_request(host: HostHandle) -> None:
    def infer_request(model: str, rid: str, inputs: list[Any]) -> service_pb2.ModelInferRequest:
        # tritonclient's stream callback drops the id of error responses, so use the raw stub here.
        request = service_pb2.ModelInferRequest(model_name=model, id=rid)
        for i in inputs:
            request.inputs.append(i._get_tensor())
            request.raw_input_contents.append(i._get_content())
        return request

    text = grpcclient.InferInput("TEXT", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"raise"], dtype=np.object_))
    ok_text = grpcclient.InferInput("TEXT", [1], "BYTES")
    ok_text.set_data_from_numpy(np.array([b"fine"], dtype=np.object_))
    requests = [
        infer_request("repeat", "a", repeat_inputs(3, delay=0.01, final_with_data=True)),
        infer_request("repeat", "neg", repeat_inputs(-1)),
        infer_request("repeat", "boom", repeat_inputs(-2)),
        infer_request("echo", "raise", [text]),
        infer_request("echo", "fine", [ok_text]),
        infer_request("no_such_model", "unknown", [ok_text]),
    ]
    with grpc.insecure_channel(host.grpc_url) as channel:
        responses = list(service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(requests)))
    by_id: dict[str, list[service_pb2.ModelStreamInferResponse]] = {}
    for r in responses:
        by_id.setdefault(r.infer_response.id, []).append(r)
    assert [len(by_id["a"]), by_id["a"][-1].error_message] == [3, ""]
    assert by_id["neg"][0].error_message == "negative count"
    assert by_id["neg"][0].infer_response.parameters["triton_final_response"].bool_param
    assert "RuntimeError: repeat was asked to raise" in by_id["boom"][0].error_message
    assert "ValueError: echo was asked to raise" in by_id["raise"][0].error_message
    assert by_id["fine"][0].error_message == "" and len(by_id["fine"]) == 1
    # A non-decoupled model's single response completes its request.
    assert by_id["fine"][0].infer_response.parameters["triton_final_response"].bool_param
    assert "Request for unknown model: 'no_such_model' is not found" in by_id["unknown"][0].error_message
    assert sum(1 for r in responses if r.error_message) == 4


def test_sixteen_concurrent_streams(host: HostHandle) -> None:
    async def one_stream(client: aioclient.InferenceServerClient, k: int) -> list[tuple[str, int, bool]]:
        async def requests() -> Any:
            yield {"model_name": "repeat", "request_id": f"s{k}",
                   "inputs": repeat_inputs(4, delay=0.005, final_with_data=True, module=aioclient)}

        got = []
        async for result, error in client.stream_infer(requests()):
            assert error is None
            got.append((result.get_response().id, int(result.as_numpy("IDX")[0]), is_final(result)))
            if got[-1][2]:
                break
        return got

    async def main() -> list[list[tuple[str, int, bool]]]:
        clients = [aioclient.InferenceServerClient(host.grpc_url) for _ in range(16)]
        try:
            return await asyncio.wait_for(asyncio.gather(*(one_stream(c, k) for k, c in enumerate(clients))), 30)
        finally:
            await asyncio.gather(*(c.close() for c in clients))

    results = asyncio.run(main())
    assert len(results) == 16
    for k, got in enumerate(results):
        assert got == [(f"s{k}", i, i == 3) for i in range(4)]


def _cancel_counters(host: HostHandle) -> tuple[float, float]:
    text = metrics_text(host)
    return (metric_value(text, "repeat_cancelled_total", model="repeat"),
            metric_value(text, "nv_inference_request_failure", model="repeat", reason="CANCELED", version="1"))


def test_aio_task_cancellation_reaches_is_cancelled(host: HostHandle) -> None:
    seen_before, failures_before = _cancel_counters(host)

    async def main() -> None:
        client = aioclient.InferenceServerClient(host.grpc_url)
        first = asyncio.Event()

        async def consume() -> None:
            async def requests() -> Any:
                yield {"model_name": "repeat", "request_id": "long",
                       "inputs": repeat_inputs(100000, delay=0.01, module=aioclient)}
                await asyncio.sleep(3600)  # keep the stream open: only cancellation ends it

            async for _result, _error in client.stream_infer(requests()):
                first.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(first.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.close()

    asyncio.run(main())
    elapsed = wait_for(lambda: _cancel_counters(host)[0] >= seen_before + 1, timeout=5)
    assert elapsed < 2.0
    wait_for(lambda: _cancel_counters(host)[1] >= failures_before + 1, timeout=5)


def test_stop_stream_with_cancel_requests_cancels_every_request(host: HostHandle) -> None:
    seen_before, _ = _cancel_counters(host)
    client = grpcclient.InferenceServerClient(host.grpc_url)
    received: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: received.put((result, error)))
    for k in range(3):
        client.async_stream_infer("repeat", repeat_inputs(100000, delay=0.01), request_id=f"c{k}")
    # Wait until every request is streaming: one the server has not read yet when the
    # stream is cancelled is never started, so it is rightly never counted as cancelled.
    streaming: set[str] = set()
    while streaming != {"c0", "c1", "c2"}:
        result, error = received.get(timeout=10)
        assert error is None
        streaming.add(result.get_response().id)
    client.stop_stream(cancel_requests=True)
    client.close()
    elapsed = wait_for(lambda: _cancel_counters(host)[0] >= seen_before + 3, timeout=5)
    assert elapsed < 2.0
    wait_for(lambda: metric_value(metrics_text(host), "repeat_active", model="repeat") == 0, timeout=5)
