"""The llm model in the embedded host, through the real tritonclient (KServe v2 gRPC)."""
from __future__ import annotations

import asyncio
import json
import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from kvserve.backend import LLM, SamplingParams
from tests.conftest import tiny_model
from tests.utils.processes import run_host

MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def host():
    env = {"KVSERVE_MODEL": tiny_model("llama"), "KVSERVE_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
           "KVSERVE_MAX_NUM_SEQS": "32", "KVSERVE_NUM_KV_BLOCKS": "512"}
    with run_host(env) as h:
        yield h


def _inputs(prompt="Once upon a time", params=None, ids=None):
    tensors = []
    if ids is not None:
        t = grpcclient.InferInput("input_ids", [len(ids)], "INT32")
        t.set_data_from_numpy(np.array(ids, dtype=np.int32))
        tensors.append(t)
    elif prompt is not None:
        t = grpcclient.InferInput("text_input", [1], "BYTES")
        t.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
        tensors.append(t)
    if params is not None:
        raw = params if isinstance(params, (bytes, str)) else json.dumps(params)
        t = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
        t.set_data_from_numpy(np.array([raw.encode() if isinstance(raw, str) else raw], dtype=np.object_))
        tensors.append(t)
    return tensors


def _stream(url, inputs, request_id="r", timeout=60):
    """Run one streamed request; returns (list of (text, ids, finish), number of final flags, error)."""
    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    client.async_stream_infer("llm", inputs, request_id=request_id, enable_empty_final_response=True)
    chunks, finals, error = [], 0, None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result, err = q.get(timeout=timeout)
        if err is not None:
            error = err
            break
        resp = result.get_response()
        final = resp.parameters["triton_final_response"].bool_param
        if resp.outputs:
            chunks.append((result.as_numpy("text_output")[0].decode(), result.as_numpy("output_ids").tolist(),
                           result.as_numpy("finish_reason")[0].decode()))
        if final:
            finals += 1
            break
    # Anything after the final flag (a second final, a stray response) would be a protocol error.
    try:
        while True:
            result, err = q.get(timeout=0.3)
            finals += 1 if err is None and result.get_response().parameters[
                "triton_final_response"].bool_param else 0
            chunks.append(("<after final>", [], ""))
    except queue.Empty:
        pass
    client.stop_stream()
    client.close()
    return chunks, finals, error


def _wait_for(predicate, timeout=2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_ready_and_decoupled_config(host):
    client = grpcclient.InferenceServerClient(host.grpc_url)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("llm")
    cfg = client.get_model_config("llm", as_json=True)["config"]
    assert cfg["model_transaction_policy"]["decoupled"] is True
    assert cfg["backend"] == "python"


def test_streamed_text_equals_offline_generate(host):
    params = {"max_tokens": 20, "temperature": 0, "ignore_eos": True}
    chunks, finals, error = _stream(host.grpc_url, _inputs("Once upon a time", params))
    assert error is None and finals == 1 and len(chunks) >= 5
    assert chunks[-1][2] == "length" and all(c[2] == "" for c in chunks[:-1])
    offline = LLM(model=tiny_model("llama"), max_model_len=MAX_MODEL_LEN).generate(
        "Once upon a time", SamplingParams(**params))[0].outputs[0]
    assert "".join(c[0] for c in chunks) == offline.text
    assert [t for c in chunks for t in c[1]] == offline.token_ids


def test_sixteen_concurrent_streams_complete(host):
    async def one(i):
        client = aioclient.InferenceServerClient(host.grpc_url)
        params = {"max_tokens": 12 + i, "temperature": 0, "ignore_eos": True}

        async def requests():
            yield {"model_name": "llm", "inputs": _inputs(f"Prompt number {i}", params, ),
                   "request_id": f"c{i}", "enable_empty_final_response": True}
        ids = []
        async for result, error in client.stream_infer(requests()):
            assert error is None
            resp = result.get_response()
            if resp.outputs:
                ids += result.as_numpy("output_ids").tolist()
            if resp.parameters["triton_final_response"].bool_param:
                break
        await client.close()
        return ids

    async def main():
        return await asyncio.gather(*[one(i) for i in range(16)])
    results = asyncio.run(main())
    assert [len(r) for r in results] == [12 + i for i in range(16)]


def test_cancelled_streams_free_every_block_and_others_finish(host):
    async def run(i, cancel):
        client = aioclient.InferenceServerClient(host.grpc_url)
        params = {"max_tokens": 200 if cancel else 16, "temperature": 0, "ignore_eos": True}

        async def requests():
            yield {"model_name": "llm", "inputs": _inputs(f"Cancel me {i}", params), "request_id": f"x{i}",
                   "enable_empty_final_response": True}
        n, final = 0, False
        try:
            async for result, error in client.stream_infer(requests()):
                assert error is None
                n += 1
                if cancel and n == 3:
                    break  # leaving the iterator cancels the gRPC call
                if result.get_response().parameters["triton_final_response"].bool_param:
                    final = True
                    break
        finally:
            await client.close()
        return n, final

    async def main():
        return await asyncio.gather(*[run(i, cancel=i < 20) for i in range(24)])
    results = asyncio.run(main())
    assert all(final for _, final in results[20:])
    assert _wait_for(lambda: host.metric("kvserve:num_requests_running") == 0
                     and host.metric("kvserve:kv_cache_usage_perc") == 0.0, timeout=2.0)
    assert host.metric("kvserve:num_requests_waiting") == 0


@pytest.mark.parametrize("inputs, message", [
    (lambda: _inputs(prompt=None, params={"max_tokens": 4}), "text_input"),
    (lambda: [_typed("text_input", np.array([1.5], dtype=np.float32), "FP32")], "text_input"),
    (lambda: _inputs("hi", params="{not json"), "sampling_parameters"),
    (lambda: _inputs("hi", params='{"temperature": ' + "9" * 5000 + "}"), "param=sampling_parameters"),
    (lambda: _inputs("hi", params='{"temperature": ' + "9" * 400 + "}"), "param=temperature"),
    (lambda: _inputs("hi", params={"temperature": -3}), "temperature"),
    (lambda: _inputs(ids=list(range(3, 3 + MAX_MODEL_LEN + 5)), params={"max_tokens": 4}), "context_length"),
])
def test_bad_request_gets_an_error_and_the_next_succeeds(host, inputs, message):
    chunks, finals, error = _stream(host.grpc_url, inputs())
    assert error is not None and message in str(error)
    chunks, finals, error = _stream(host.grpc_url, _inputs("fine", {"max_tokens": 4}))
    assert error is None and finals == 1 and chunks


def _typed(name, arr, dtype):
    t = grpcclient.InferInput(name, list(arr.shape), dtype)
    t.set_data_from_numpy(arr)
    return t


def test_non_decoupled_infer_is_refused(host):
    client = grpcclient.InferenceServerClient(host.grpc_url)
    with pytest.raises(InferenceServerException):
        client.infer("llm", _inputs("hi", {"max_tokens": 2}))


def test_engine_control_resets_the_prefix_cache_and_refuses_unknown_actions(host):
    from kvserve.frontend.backend_client import BackendRejected, TritonBackendClient
    from kvserve.seam.error_wire import ErrorKind

    async def main():
        client = TritonBackendClient(host.grpc_url)
        try:
            answer = await client.engine_control("reset_prefix_cache")
            with pytest.raises(BackendRejected) as info:
                await client.engine_control("drop_weights")
            return answer, info.value
        finally:
            await client.close()

    prompt = "a prompt long enough to fill whole blocks of the cache " * 4
    chunks, _, error = _stream(host.grpc_url, _inputs(prompt, {"max_tokens": 2}))
    assert error is None and chunks
    answer, refusal = asyncio.run(main())
    assert answer["action"] == "reset_prefix_cache" and answer["forgotten_blocks"] > 0
    assert refusal.kind is ErrorKind.INVALID and "reset_prefix_cache" in str(refusal)
