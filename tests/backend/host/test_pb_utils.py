"""triton_python_backend_utils semantics, checked without a server."""
from __future__ import annotations

import json
import logging
import sys

import numpy as np
import pytest

from kvserve.backend.host import pb_utils
from kvserve.backend.host.host_metrics import REGISTRY, render_text
from kvserve.backend.host.pb_utils.inference_request import new_server_request

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class RecordingSink:
    def __init__(self) -> None:
        self.sent: list[tuple[object, int]] = []
        self.cancelled = False

    def deliver(self, response: object, flags: int) -> None:
        self.sent.append((response, flags))

    def is_cancelled(self) -> bool:
        return self.cancelled


def make_request(decoupled: bool, sink: RecordingSink, **params: object) -> pb_utils.InferenceRequest:
    return new_server_request(
        request_id="r", correlation_id=0, inputs=[pb_utils.Tensor("A", np.zeros(2, np.float32))],
        requested_output_names=["B"], model_name="m", model_version=1, flags=0, timeout=0,
        parameters=dict(params), sink=sink, decoupled=decoupled)


def test_install_registers_the_module_under_tritons_name() -> None:
    module = pb_utils.install()
    import triton_python_backend_utils as imported  # noqa: PLC0415

    assert imported is module is sys.modules["triton_python_backend_utils"]
    for name in ("Tensor", "InferenceRequest", "InferenceResponse", "TritonError", "TritonModelException",
                 "Logger", "MetricFamily", "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "get_input_tensor_by_name",
                 "get_output_tensor_by_name", "get_input_config_by_name", "get_output_config_by_name",
                 "triton_string_to_numpy", "numpy_to_triton_type", "triton_to_numpy_type",
                 "using_decoupled_model_transaction_policy"):
        assert hasattr(imported, name), name
    assert imported.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1


def test_triton_error_codes_and_default() -> None:
    E = pb_utils.TritonError
    assert [E.UNKNOWN, E.INTERNAL, E.NOT_FOUND, E.INVALID_ARG, E.UNAVAILABLE, E.UNSUPPORTED,
            E.ALREADY_EXISTS, E.CANCELLED] == list(range(8))
    err = E("boom")
    assert err.message() == "boom" and err.code() == E.INTERNAL
    assert E("gone", E.NOT_FOUND).code() == E.NOT_FOUND
    assert not isinstance(err, BaseException)  # a value carried by a response, never raised
    with pytest.raises(TypeError):
        E("bad code", 42)


def test_tensor_numeric_bytes_and_dlpack() -> None:
    t = pb_utils.Tensor("X", np.arange(6, dtype=np.int32).reshape(2, 3))
    assert t.name() == "X" and t.shape() == [2, 3] and t.triton_dtype() == 8 and t.is_cpu()
    back = pb_utils.Tensor.from_dlpack("Y", t.to_dlpack())
    assert back.name() == "Y" and np.array_equal(back.as_numpy(), t.as_numpy())
    b = pb_utils.Tensor("S", np.array([b"ab", b""], dtype=np.bytes_))
    assert b.as_numpy().dtype == np.object_ and list(b.as_numpy()) == [b"ab", b""]
    assert b.triton_dtype() == 13
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor("U", np.array(["text"]))  # unicode arrays are refused, as in Triton


def test_dtype_helpers_and_bytes_roundtrip() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.triton_string_to_numpy("TYPE_BOOL") is bool
    assert pb_utils.numpy_to_triton_type(np.object_) == 13 and pb_utils.numpy_to_triton_type(np.float16) == 10
    assert pb_utils.triton_to_numpy_type(13) is np.object_ and pb_utils.triton_to_numpy_type(11) is np.float32
    data = np.array([b"", b"a\x00b", "caf\u00e9"], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(data)
    assert encoded[:4] == b"\x00\x00\x00\x00" and encoded[4:8] == b"\x03\x00\x00\x00"
    assert list(pb_utils.deserialize_bytes_tensor(encoded)) == [b"", b"a\x00b", "caf\u00e9".encode()]


def test_response_validation() -> None:
    r = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("O", np.ones(1))], parameters={"k": 1})
    assert json.loads(r.parameters()) == {"k": 1} and not r.has_error()
    assert pb_utils.get_output_tensor_by_name(r, "O") is not None
    assert pb_utils.get_output_tensor_by_name(r, "missing") is None
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(output_tensors=[], parameters={"k": 1.5})  # only bool/int/str
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(output_tensors=[np.ones(1)])
    err = pb_utils.InferenceResponse(error=pb_utils.TritonError("x"))
    assert err.has_error() and err.error().message() == "x" and err.output_tensors() == []


def test_decoupled_sender_refuses_sends_after_final() -> None:
    sink = RecordingSink()
    sender = make_request(True, sink).get_response_sender()
    sender.send(pb_utils.InferenceResponse(output_tensors=[]))
    sender.send(pb_utils.InferenceResponse(output_tensors=[]))
    sender.send(flags=FINAL)
    with pytest.raises(pb_utils.TritonModelException, match="Response sender has been closed"):
        sender.send(pb_utils.InferenceResponse(output_tensors=[]))
    with pytest.raises(pb_utils.TritonModelException, match="Response sender has been closed"):
        sender.send(flags=FINAL)
    assert [flags for _, flags in sink.sent] == [0, 0, FINAL]
    with pytest.raises(pb_utils.TritonModelException, match="Unsupported flag"):
        make_request(True, RecordingSink()).get_response_sender().send(flags=2)
    with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
        make_request(True, RecordingSink()).get_response_sender().send()


def test_non_decoupled_sender_allows_exactly_one_response() -> None:
    sink = RecordingSink()
    sender = make_request(False, sink).get_response_sender()
    with pytest.raises(pb_utils.TritonModelException, match="cannot send complete final before"):
        sender.send(flags=FINAL)
    sender.send(pb_utils.InferenceResponse(output_tensors=[]))
    with pytest.raises(pb_utils.TritonModelException, match="cannot send more than one response"):
        sender.send(pb_utils.InferenceResponse(output_tensors=[]))
    sender.send(flags=FINAL)
    assert [flags for _, flags in sink.sent] == [0, FINAL]


def test_request_accessors_and_cancellation() -> None:
    sink = RecordingSink()
    request = make_request(True, sink, traceparent="00-abc-01", n=3)
    assert json.loads(request.parameters()) == {"traceparent": "00-abc-01", "n": 3}
    assert request.request_id() == "r" and request.correlation_id() == 0 and request.flags() == 0
    assert request.requested_output_names() == ["B"]
    assert pb_utils.get_input_tensor_by_name(request, "A") is not None
    assert pb_utils.get_input_tensor_by_name(request, "missing") is None
    assert request.get_response_sender() is request.get_response_sender()
    assert not request.is_cancelled() and not request.get_response_sender().is_cancelled()
    sink.cancelled = True
    assert request.is_cancelled() and request.get_response_sender().is_cancelled()
    bls = pb_utils.InferenceRequest(model_name="other", inputs=[], requested_output_names=[])
    with pytest.raises(pb_utils.TritonModelException):
        bls.exec()


def test_metric_family_kinds_and_exposition() -> None:
    counter = pb_utils.MetricFamily("pbtest_requests", "requests", pb_utils.MetricFamily.COUNTER)
    metric = counter.Metric(labels={"model": "m"})
    metric.increment(2)
    metric.increment(3)
    assert metric.value() == 5
    # Same family name and labels: the same series, as in Triton.
    again = pb_utils.MetricFamily("pbtest_requests", "requests", pb_utils.MetricFamily.COUNTER)
    assert again.Metric(labels={"model": "m"}).value() == 5
    with pytest.raises(pb_utils.TritonModelException):
        metric.increment(-1)
    with pytest.raises(pb_utils.TritonModelException):
        metric.set(1)
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.MetricFamily("pbtest_requests", "requests", pb_utils.MetricFamily.GAUGE)
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.MetricFamily("bad name", "x", pb_utils.MetricFamily.GAUGE)

    gauge = pb_utils.MetricFamily("pbtest_running", "running", pb_utils.MetricFamily.GAUGE).Metric()
    gauge.set(4)
    gauge.increment(-1)
    assert gauge.value() == 3

    family = pb_utils.MetricFamily("pbtest_latency_seconds", "latency", pb_utils.MetricFamily.HISTOGRAM)
    with pytest.raises(pb_utils.TritonModelException):
        family.Metric(labels={})  # histograms need buckets
    hist = family.Metric(labels={"model": "m"}, buckets=[0.1, 1.0])
    for v in (0.05, 0.1, 0.5, 5.0):
        hist.observe(v)
    with pytest.raises(pb_utils.TritonModelException):
        hist.value()

    text = render_text(REGISTRY).decode()
    assert "# TYPE pbtest_requests counter\n" in text and 'pbtest_requests{model="m"} 5\n' in text
    assert "pbtest_requests_total" not in text  # names exactly as given, like tritonserver
    assert 'pbtest_latency_seconds_bucket{le="0.1",model="m"} 2\n' in text
    assert 'pbtest_latency_seconds_bucket{le="1",model="m"} 3\n' in text
    assert 'pbtest_latency_seconds_bucket{le="+Inf",model="m"} 4\n' in text
    assert 'pbtest_latency_seconds_count{model="m"} 4\n' in text


def test_logger_reports_the_callers_location(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="kvserve.host.model"):
        pb_utils.Logger.log_info("hello info")
        pb_utils.Logger.log_warn("hello warn")
        pb_utils.Logger.log("hello verbose", pb_utils.Logger.VERBOSE)
    levels = {r.getMessage(): r.levelno for r in caplog.records}
    assert levels == {"hello info": logging.INFO, "hello warn": logging.WARNING, "hello verbose": logging.DEBUG}
    assert all(r.filename == "test_pb_utils.py" for r in caplog.records)


def test_config_helpers_and_auto_complete_object() -> None:
    config = {"name": "m", "max_batch_size": 0, "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}],
              "output": [], "model_transaction_policy": {"decoupled": True}}
    assert pb_utils.get_input_config_by_name(config, "A")["dims"] == [4]
    assert pb_utils.get_input_config_by_name(config, "B") is None
    assert pb_utils.get_output_config_by_name(config, "A") is None
    assert pb_utils.using_decoupled_model_transaction_policy(config) is True
    assert pb_utils.using_decoupled_model_transaction_policy({"name": "x"}) is False
    auto = pb_utils.ModelConfig(json.dumps(config))
    auto.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]})
    with pytest.raises(ValueError):
        auto.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [4]})  # conflicts with the config
    with pytest.raises(ValueError):
        auto.set_model_transaction_policy({"decoupled": False})  # config.pbtxt said decoupled
    assert auto.as_dict()["output"][0]["name"] == "OUT"
