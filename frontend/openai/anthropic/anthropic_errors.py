"""Errors in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`, with the error
type Anthropic gives each HTTP status. The `ApiError` raised anywhere on the path (the body reader,
validation, the backend mapping) is the same one the OpenAI routes raise; only its body differs,
and `error_response` (the middleware's one way out for errors) picks it by the request's path."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from kvserve.frontend.openai.api_errors import ApiError

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_body(exc: ApiError) -> dict[str, Any]:
    kind = _TYPE_BY_STATUS.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def anthropic_error_response(exc: ApiError) -> web.Response:
    return exc.to_response(anthropic_error_body(exc))


# The routes that answer in Anthropic's shape (routes.py mounts them).
ANTHROPIC_PATHS = ("/v1/messages",)


def error_response(path: str, exc: ApiError) -> web.Response:
    """`exc` in the shape of the API `path` belongs to: Anthropic's on its routes, OpenAI's elsewhere
    (the body reader's, the API-key check's and aiohttp's own 404/405/413 included)."""
    if path in ANTHROPIC_PATHS or path.startswith(tuple(p + "/" for p in ANTHROPIC_PATHS)):
        return anthropic_error_response(exc)
    return exc.to_response()
