"""aiohttp middlewares, outermost first (app.py puts cors.preflight before `auth`):

1. `observe`  - server span, request id, metrics by route template and status,
                optional one-line request log (never the prompt);
2. `errors`   - every failure becomes an OpenAI error object; aiohttp's own
                404/405/413 included; no traceback reaches the client;
3. `trusted_host` - a Host header naming another server is a 421 (DNS rebinding,
                see host_policy.py);
4. `auth`     - API key (`Authorization: Bearer KEY`, or `x-api-key: KEY` as
                Anthropic's clients send it) on every route but /health, /metrics
                and /version (unknown routes included, so a client without a key
                cannot probe which routes exist); it resolves the key's tenant.

Errors leave in the shape of the route's API (`error_response`: Anthropic's on /v1/messages).
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import time
import uuid
from http import HTTPStatus
from typing import Awaitable, Callable

from aiohttp import web
from opentelemetry import trace

from kvserve.frontend.backend_client import UNMATCHED_ROUTE, ServerSpan, start_server_span
from kvserve.frontend.http.api_keys import key_digest, match_key
from kvserve.frontend.http.gateway import GATEWAY
from kvserve.frontend.openai import PUBLIC_PATHS as OPENAPI_PUBLIC_PATHS, ApiError, error_response, internal_error
from kvserve.observability.logging import request_context

log = logging.getLogger("kvserve.frontend.http")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Per-request values live in contextvars: the handler runs in the middleware's
# task, and this needs no aiohttp-version-specific request keys.
_SPAN: contextvars.ContextVar[ServerSpan | None] = contextvars.ContextVar("kvserve_span", default=None)
_REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("kvserve_request_id", default="")
_CLIENT_REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("kvserve_client_id", default=None)
_TENANT: contextvars.ContextVar[str | None] = contextvars.ContextVar("kvserve_tenant", default=None)
_KEY_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("kvserve_key_id", default=None)
# What probes and scrapers reach without a key; everything else needs one when keys are set.
PUBLIC_PATHS = frozenset(OPENAPI_PUBLIC_PATHS)
_CLIENT_GONE = 499  # nginx's convention for "client closed the request"
_SAFE_ID = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")


def route_template(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else UNMATCHED_ROUTE


def request_id() -> str:
    return _REQUEST_ID.get()


def response_id(prefix: str, fresh: str, body_request_id: str | None = None) -> str:
    """The id a response names itself by, as vLLM makes it: the client's X-Request-Id, else the
    body's `request_id`, else `fresh` (the engine's own id for the call), after the object's
    prefix ("chatcmpl-..."). A client's id need not be unique, so it is never the engine's key."""
    chosen = _CLIENT_REQUEST_ID.get() or body_request_id
    return fresh if chosen is None else f"{prefix}-{chosen}"


def request_span() -> ServerSpan | None:
    return _SPAN.get()


def request_tenant() -> str | None:
    """The authenticated client's tenant; None when the server has no API keys."""
    return _TENANT.get()


def request_key_id() -> str | None:
    """The presented API key's digest (hex), which owns what a client stores (stored responses):
    several keys may share a tenant, and none may read another's. None without API keys."""
    return _KEY_ID.get()


@web.middleware
async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    route = route_template(request)
    incoming = request.headers.get("X-Request-Id", "")
    chosen = incoming if _SAFE_ID.match(incoming) else None
    _CLIENT_REQUEST_ID.set(chosen)
    rid = chosen or uuid.uuid4().hex
    _REQUEST_ID.set(rid)
    span = start_server_span(request, route)
    _SPAN.set(span)
    start = time.perf_counter()
    status = 500
    # The span is current for the handler, so log lines inside carry its trace id.
    with trace.use_span(span.span, end_on_exit=False), request_context(rid, traceparent=span.incoming):
        try:
            response = await handler(request)
            status = response.status
            if not response.prepared:
                response.headers["X-Request-Id"] = rid
            return response
        except asyncio.CancelledError:
            status = _CLIENT_GONE
            raise
        finally:
            elapsed = time.perf_counter() - start
            gateway.metrics.observe_request(route, status, elapsed)
            span.set_status(status)
            span.end()
            if gateway.config.log_requests:
                log.info("http request", extra={"method": request.method, "route": route,
                                                "status": status, "duration_s": round(elapsed, 4)})


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(request.path, exc)
    except web.HTTPException as exc:
        return error_response(request.path, _from_http_exception(request, exc))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:
        # No traceback at error level: it would put file paths (and maybe request
        # values quoted by an exception) in the logs; debug logging has it.
        log.error("unhandled error on %s %s: %s", request.method, route_template(request), type(exc).__name__)
        log.debug("unhandled error", exc_info=True)
        return error_response(request.path, internal_error())


def _from_http_exception(request: web.Request, exc: web.HTTPException) -> ApiError:
    # Nothing of the request is quoted (not the path, not the method): an error body that
    # reflects request bytes is a reflection channel, and the client knows what it sent.
    if exc.status == 404:
        return ApiError(404, "no such route", code="not_found")
    if exc.status == 405:
        allow = exc.headers.get("Allow", "")
        return ApiError(405, "method not allowed on this route (see the Allow header)", code="method_not_allowed",
                        headers={"Allow": allow})
    if exc.status == 413:
        limit = request.app[GATEWAY].config.max_request_body_bytes
        return ApiError(413, f"request body is larger than {limit} bytes", code="request_too_large")
    try:
        phrase = HTTPStatus(exc.status).phrase  # the standard phrase, not whatever text came with it
    except ValueError:
        phrase = "request failed"
    return ApiError(exc.status, phrase)


@web.middleware
async def trusted_host(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not request.app[GATEWAY].config.hosts.allows(request.headers.get("Host")):
        # 421 Misdirected Request: this server does not answer for that name. The name is not quoted.
        raise ApiError(421, "this server does not answer for the requested Host (see --allowed-hosts)",
                       code="misdirected_request")
    return await handler(request)


@web.middleware
async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    digests = request.app[GATEWAY].key_digests
    if digests and request.path not in PUBLIC_PATHS:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer":
            token = request.headers.get("x-api-key", "")
        tenant = match_key(token.strip(), digests) if token.strip() else None
        if tenant is None:
            raise ApiError(401, "invalid or missing API key", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        _TENANT.set(tenant)
        _KEY_ID.set(key_digest(token.strip()).hex())
    return await handler(request)

