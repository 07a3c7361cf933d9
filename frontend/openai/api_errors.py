"""OpenAI-style error objects and the one exception the gateway raises for them.

Every failure a client can see goes through `ApiError`, so the wire shape
(`{"error": {"message", "type", "param", "code"}}`) is decided in one place and
no handler can leak a traceback or echo a whole request back.
"""
from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from kvserve.seam import tensors as T
from kvserve.seam.error_wire import ErrorKind

# Long messages are cut: a client that sends a 1 MB prompt must not get it back.
MAX_MESSAGE_CHARS = 512

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    408: "timeout_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ApiError(Exception):
    """An error with an HTTP status and an OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
        close_connection: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = clip(message)
        self.param = param
        self.code = code
        self.type = type or _TYPE_BY_STATUS.get(status, "invalid_request_error")
        self.headers = headers or {}
        self.close_connection = close_connection  # e.g. the rest of the body is not worth reading

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def to_response(self, body: dict[str, Any] | None = None) -> web.Response:
        """`body`: the same error in another API's shape (Anthropic's, on /v1/messages)."""
        response = web.Response(
            status=self.status,
            text=json.dumps(self.body() if body is None else body),
            content_type="application/json",
            headers=self.headers,
        )
        if self.close_connection:
            response.force_close()
        return response


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def not_supported(param: str, what: str) -> ApiError:
    return ApiError(400, f"{what} is not supported by this server", param=param, code="unsupported_parameter")


def model_not_found() -> ApiError:
    # OpenAI quotes the name back; here no error body carries request bytes (docs/security.md): param
    # says which field was wrong, and the client knows what it sent.
    return ApiError(404, "the requested model does not exist (GET /v1/models lists them)", param="model",
                    code="model_not_found")


def backend_unavailable(detail: str = "the model backend is not ready") -> ApiError:
    return ApiError(503, detail, code="backend_unavailable", headers={"Retry-After": "1"})


def shutting_down() -> ApiError:
    # Retry-After: another replica (behind the same load balancer) can take it now.
    return ApiError(503, "the server is shutting down", code="shutting_down", headers={"Retry-After": "1"})


def internal_error() -> ApiError:
    # Never carries the exception text: internal details stay in the server log.
    return ApiError(500, "internal server error", code="internal_error")


def from_backend(exc: Exception, *, prompt_param: str, constraint_param: str | None = None) -> ApiError:
    """The one mapping from backend failures to HTTP errors.

    `prompt_param` is "messages" for chat and "prompt" for completions, so a
    too-long input points at the field the client actually sent; likewise
    `constraint_param` for a structured-output constraint that did not compile
    (response_format, tools, a guided_* field, or structured_outputs itself).
    """
    # Imported here: protocol.py is plain data, but keeping errors.py free of it
    # lets every module import errors without cycles.
    from kvserve.frontend.backend_client import BackendRejected, BackendUnavailable, ShuttingDown

    if isinstance(exc, BackendRejected):
        if exc.overloaded:
            return ApiError(503, "the server is overloaded, retry later", code="overloaded", headers={"Retry-After": "1"})
        if exc.kind is ErrorKind.TIMEOUT:
            # The client's own `timeout` ran out: a 4xx (408), not a server failure.
            return ApiError(408, exc.message, code="timeout", type="timeout_error")
        if exc.kind is ErrorKind.CONTEXT_LENGTH:
            return ApiError(400, exc.message, param=prompt_param, code="context_length_exceeded")
        if exc.kind is ErrorKind.NOT_FOUND:  # a LoRA adapter the backend does not serve (or no longer)
            return model_not_found()
        param = exc.param
        if param == T.SAMPLING_PARAMETERS:
            param = None
        elif param in ("prompt", T.INPUT_IDS, T.TEXT_INPUT):
            param = prompt_param
        elif param == "logprobs" and prompt_param == "messages":
            param = "top_logprobs"
        elif param == "structured_outputs" and constraint_param and constraint_param != param:
            message = exc.message.split(": ", 1)[-1] if exc.message.startswith(param) else exc.message
            return ApiError(400, f"{constraint_param}: {message}", param=constraint_param)
        return ApiError(400, exc.message, param=param)
    if isinstance(exc, ShuttingDown):
        return shutting_down()
    if isinstance(exc, BackendUnavailable):
        return backend_unavailable()
    return internal_error()
