"""Health, metadata, config and ModelInfer against an in-process host, through the
real tritonclient.grpc client (and the raw stub where the client cannot express
something, such as typed `contents`)."""
from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from host_fixtures import http_get, metric_value, metrics_text
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from kvserve.backend.host import HostHandle


@pytest.fixture(scope="module")
def client(host: HostHandle) -> grpcclient.InferenceServerClient:
    c = grpcclient.InferenceServerClient(host.grpc_url)
    yield c
    c.close()


def _text_input(values: list[bytes], shape: list[int] | None = None) -> grpcclient.InferInput:
    array = np.array(values, dtype=np.object_).reshape(shape or [len(values)])
    t = grpcclient.InferInput("TEXT", list(array.shape), "BYTES")
    t.set_data_from_numpy(array)
    return t


def test_liveness_and_strict_readiness(host: HostHandle, client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    # `failing` could not load, so the server as a whole is not ready (tritonserver's strict readiness)...
    assert not client.is_server_ready()
    # ...while every model that loaded is ready and serving.
    assert [client.is_model_ready(m) for m in ("add_sub", "echo", "repeat")] == [True, True, True]
    assert not client.is_model_ready("failing") and not client.is_model_ready("no_such_model")
    assert client.is_model_ready("echo", "1") and not client.is_model_ready("echo", "2")
    for bad_version in ("abc", "-1", "\u00b2"):  # malformed, not merely absent: INVALID_ARGUMENT, as tritonserver
        with pytest.raises(InferenceServerException, match="version should be an integral value") as err:
            client.is_model_ready("echo", bad_version)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert http_get(f"http://{host.host}:{host.metrics_port}/v2/health/live")[0] == 200
    assert http_get(f"http://{host.host}:{host.metrics_port}/v2/health/ready")[0] == 400
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["failing"].state == "UNAVAILABLE" and "initialize failed on purpose" in index["failing"].reason
    assert index["echo"].state == "READY"


def test_model_config_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.get_model_config("repeat").config.model_transaction_policy.decoupled is True
    echo = client.get_model_config("echo").config
    assert not echo.model_transaction_policy.decoupled
    assert echo.parameters["greeting"].string_value == "hello"
    meta = client.get_model_metadata("echo")
    assert meta.platform == "python" and list(meta.versions) == ["1"]
    assert [(i.name, i.datatype, list(i.shape)) for i in meta.inputs] == [("TEXT", "BYTES", [-1])]
    with pytest.raises(InferenceServerException, match="failing"):
        client.get_model_config("failing")
    assert client.get_server_metadata().name == "triton"


def test_initialize_receives_tritons_args(client: grpcclient.InferenceServerClient) -> None:
    args = json.loads(client.infer("echo", [_text_input([b"args"])]).as_numpy("TEXT_OUT")[0])
    assert args["model_name"] == "echo" and args["model_version"] == "1"
    assert args["model_instance_name"] == "echo_0_0" and args["model_instance_kind"] == "CPU"
    assert args["model_instance_device_id"] == "0" and args["model_repository"].endswith("/echo")
    config = json.loads(args["model_config"])
    assert config["parameters"] == {"greeting": {"string_value": "hello"}}
    assert config["output"][1]["dims"] == [1]


def test_model_infer_numeric(client: grpcclient.InferenceServerClient) -> None:
    a = np.array([1.5, 2.0, -3.0, 4.0], dtype=np.float32)
    b = np.array([0.5, 1.0, 1.0, -4.0], dtype=np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs, request_id="sum-1")
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response().id == "sum-1" and result.get_response().model_version == "1"


def test_model_infer_bytes_raw_and_typed(host: HostHandle, client: grpcclient.InferenceServerClient) -> None:
    values = [b"ab", b"", b"x\x00y", "caf\u00e9".encode()]
    result = client.infer("echo", [_text_input(values)], outputs=[grpcclient.InferRequestedOutput("TEXT_OUT")])
    out = result.as_numpy("TEXT_OUT")
    assert out.shape == (4,) and list(out) == [v.upper() for v in values]
    assert result.as_numpy("PARAMS") is None  # only the requested output comes back

    # The same through typed `contents` (bytes_contents) instead of raw_input_contents.
    request = service_pb2.ModelInferRequest(model_name="echo", id="typed")
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=[2])
    tensor.contents.bytes_contents.extend([b"q", b"rs"])
    with grpc.insecure_channel(host.grpc_url) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    names = [o.name for o in response.outputs]
    raw = response.raw_output_contents[names.index("TEXT_OUT")]
    assert raw == b"\x01\x00\x00\x00Q\x02\x00\x00\x00RS" and response.id == "typed"


def test_decoupled_model_rejected_by_model_infer(client: grpcclient.InferenceServerClient) -> None:
    count = grpcclient.InferInput("IN", [1], "INT32")
    count.set_data_from_numpy(np.array([2], dtype=np.int32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("repeat", [count])
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in info.value.message()


def test_errors_reach_only_their_request(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as raised:
        client.infer("echo", [_text_input([b"raise"])])
    assert raised.value.status() == "StatusCode.INTERNAL"
    assert raised.value.message() == ("Failed to process the request(s) for model 'echo_0_0', "
                                      "message: ValueError: echo was asked to raise")
    with pytest.raises(InferenceServerException) as returned:
        client.infer("echo", [_text_input([b"error"])])
    assert returned.value.status() == "StatusCode.NOT_FOUND"
    assert returned.value.message() == "echo was asked for an error"
    # The model is still healthy and serves the next request.
    assert list(client.infer("echo", [_text_input([b"ok"])]).as_numpy("TEXT_OUT")) == [b"OK"]


def test_requests_are_validated_against_the_config(client: grpcclient.InferenceServerClient) -> None:
    one = grpcclient.InferInput("INPUT0", [4], "FP32")
    one.set_data_from_numpy(np.zeros(4, np.float32))
    with pytest.raises(InferenceServerException, match=r"missing required input\(s\) \['INPUT1'\]"):
        client.infer("add_sub", [one])
    wrong = grpcclient.InferInput("INPUT1", [4], "INT32")
    wrong.set_data_from_numpy(np.zeros(4, np.int32))
    with pytest.raises(InferenceServerException, match="data-type is 'INT32', but model 'add_sub' expects 'FP32'"):
        client.infer("add_sub", [one, wrong])
    short = grpcclient.InferInput("INPUT1", [3], "FP32")
    short.set_data_from_numpy(np.zeros(3, np.float32))
    with pytest.raises(InferenceServerException, match=r"Expected \[4\], got \[3\]"):
        client.infer("add_sub", [one, short])
    twice = grpcclient.InferInput("INPUT0", [4], "FP32")
    twice.set_data_from_numpy(np.ones(4, np.float32))
    with pytest.raises(InferenceServerException, match="input 'INPUT0' already exists in request"):
        client.infer("add_sub", [one, twice, short])  # as tritonserver: never silently pick one of them
    with pytest.raises(InferenceServerException) as unknown:
        client.infer("no_such_model", [one])
    assert unknown.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as unavailable:
        client.infer("failing", [one])
    # tritonserver's lifecycle: a known model with no READY version is NOT_FOUND too
    assert unavailable.value.status() == "StatusCode.NOT_FOUND"
    assert unavailable.value.message() == "Request for unknown model: 'failing' has no available versions"


def test_rpcs_this_host_leaves_out_say_so(client: grpcclient.InferenceServerClient, caplog) -> None:
    with caplog.at_level("ERROR"):
        for call in (lambda: client.get_inference_statistics("echo"), lambda: client.get_log_settings(),
                     lambda: client.get_system_shared_memory_status()):
            with pytest.raises(InferenceServerException, match="not implemented by kvserve's embedded host") as err:
                call()
            assert err.value.status() == "StatusCode.UNIMPLEMENTED"
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # no error line per call


def test_request_parameters_and_ids_reach_the_model(client: grpcclient.InferenceServerClient) -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    result = client.infer(
        "echo", [_text_input([b"p"])], request_id="req-42", sequence_id=7, sequence_start=True,
        parameters={"traceparent": traceparent, "max_tokens": 16, "stream": True, "temperature": 0.5},
        outputs=[grpcclient.InferRequestedOutput("PARAMS"), grpcclient.InferRequestedOutput("INFO")])
    params = json.loads(result.as_numpy("PARAMS")[0])
    assert params == {"traceparent": traceparent, "max_tokens": 16, "stream": True, "temperature": 0.5}
    info = json.loads(result.as_numpy("INFO")[0])
    assert info["request_id"] == "req-42" and info["correlation_id"] == 7 and info["flags"] == 1
    assert info["requested"] == ["PARAMS", "INFO"] and info["missing_input_is_none"] is True
    assert result.get_response().parameters["echoed"].bool_param is True  # response parameters come back


def test_metrics_port_serves_model_and_host_metrics(host: HostHandle, client: grpcclient.InferenceServerClient) -> None:
    before = metrics_text(host)
    for _ in range(3):
        client.infer("echo", [_text_input([b"m"])])
    with pytest.raises(InferenceServerException):
        client.infer("echo", [_text_input([b"error"])])
    after = metrics_text(host)
    assert "# TYPE echo_requests_total counter" in after
    assert metric_value(after, "echo_requests_total", model="echo") == \
        metric_value(before, "echo_requests_total", model="echo") + 4  # the model's own counter saw all four
    assert metric_value(after, "nv_inference_request_success", model="echo", version="1") == \
        metric_value(before, "nv_inference_request_success", model="echo", version="1") + 3
    assert metric_value(after, "nv_inference_request_failure", model="echo", reason="BACKEND", version="1") >= 2

    def delta(name: str) -> float:
        return metric_value(after, name, model="echo", version="1") - metric_value(before, name, model="echo", version="1")

    # As tritonserver: the failure moves only the failure counter; counts and durations are the
    # successful requests' (so duration / success is their mean latency); all four executed.
    assert delta("nv_inference_count") == 3 and delta("nv_inference_exec_count") == 4
    assert delta("nv_inference_request_duration_us") > 0 and delta("nv_inference_queue_duration_us") >= 0
    assert metric_value(after, "nv_inference_request_failure", model="echo", reason="BACKEND", version="1") == \
        metric_value(before, "nv_inference_request_failure", model="echo", reason="BACKEND", version="1") + 1
    assert http_get(f"http://{host.host}:{host.metrics_port}/nope")[0] == 404
