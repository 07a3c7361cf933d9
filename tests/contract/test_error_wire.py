"""Every error kind crosses the seam intact, and each reaches the client as its own HTTP answer."""
from __future__ import annotations

import pytest

from kvserve.frontend.backend_client.grpc_codec import classify_error
from kvserve.frontend.backend_client.protocol import BackendFailed, BackendRejected
from kvserve.frontend.openai.api_errors import from_backend
from kvserve.seam.error_wire import ErrorKind, RequestError, WireError

_HTTP = {ErrorKind.INVALID: 400, ErrorKind.CONTEXT_LENGTH: 400, ErrorKind.OVERLOADED: 503,
         ErrorKind.SHUTDOWN: 503, ErrorKind.TIMEOUT: 408, ErrorKind.NOT_FOUND: 404, ErrorKind.INTERNAL: 500}


@pytest.mark.parametrize("kind", list(ErrorKind), ids=lambda k: k.value)
@pytest.mark.parametrize("param", [None, "max_tokens", "messages.content"])
@pytest.mark.parametrize("wrap", ["{}", "Failed to process the request(s) for model 'llm', message: {}"])
def test_every_kind_round_trips(kind, param, wrap) -> None:
    sent = WireError(kind, "max_tokens: must be >= 1\nsecond line [kvserve", param)
    assert WireError.parse(wrap.format(sent.format())) == sent


def test_a_param_that_is_not_a_field_name_stays_out_of_the_header() -> None:
    sent = WireError(ErrorKind.INVALID, "x] y: unknown sampling parameter", "x] kind=internal")
    assert WireError.parse(sent.format()) == WireError(ErrorKind.INVALID, sent.message, None)


def test_text_without_the_header_is_not_an_engine_error() -> None:
    assert WireError.parse("max_tokens: must be an integer >= 1") is None
    assert isinstance(classify_error("context_length_exceeded: too long"), BackendFailed)


def test_request_error_is_a_value_error_that_keeps_kind_and_param() -> None:
    exc = RequestError("context_length_exceeded: 9 > 8", "prompt", ErrorKind.CONTEXT_LENGTH)
    assert isinstance(exc, ValueError)
    assert exc.wire() == WireError(ErrorKind.CONTEXT_LENGTH, "context_length_exceeded: 9 > 8", "prompt")


@pytest.mark.parametrize("kind", list(ErrorKind), ids=lambda k: k.value)
def test_each_kind_has_its_http_answer(kind) -> None:
    backend_error = classify_error(WireError(kind, "msg", "temperature").format())
    assert isinstance(backend_error, BackendFailed if kind is ErrorKind.INTERNAL else BackendRejected)
    api = from_backend(backend_error, prompt_param="messages")
    assert api.status == _HTTP[kind]
    if kind is ErrorKind.INVALID:
        assert api.param == "temperature"
    if kind is ErrorKind.CONTEXT_LENGTH:
        assert (api.param, api.code) == ("messages", "context_length_exceeded")
    if kind is ErrorKind.NOT_FOUND:  # an unknown LoRA adapter reads as an unknown model
        assert (api.param, api.code) == ("model", "model_not_found")
    if kind is ErrorKind.INTERNAL:
        assert "msg" not in api.message  # internal details stay in the server's log
