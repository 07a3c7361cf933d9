"""CORS, for browser clients that call the gateway from another origin.

vLLM's flags and meaning (`--allowed-origins`, `--allowed-methods`,
`--allowed-headers`, `--allow-credentials`), with one difference: vLLM allows
every origin by default; kvserve allows none until told, so a web page a user
happens to open cannot read from a server on their machine or network.

Two hooks, because streamed responses send their headers from inside the handler:
- `preflight` answers OPTIONS preflights before the router and the API-key
  check (a browser's preflight carries no key);
- `add_cors_headers` runs on aiohttp's response-prepare signal, so every
  response gets the headers: JSON, SSE streams and error objects alike.
"""
from __future__ import annotations

from aiohttp import web

from kvserve.frontend.http.cors_policy import ANY, CorsPolicy
from kvserve.frontend.http.gateway import GATEWAY
from kvserve.frontend.http.middleware import Handler
from kvserve.frontend.openai import ApiError

_PREFLIGHT_MAX_AGE_S = "600"


@web.middleware
async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
    policy: CorsPolicy = request.app[GATEWAY].config.cors
    method = request.headers.get("Access-Control-Request-Method")
    origin = request.headers.get("Origin")
    if request.method != "OPTIONS" or not policy.enabled or not method or not origin:
        return await handler(request)
    headers = policy.response_headers(origin)
    if not headers or not policy.allows_method(method):
        # Not allowed: no CORS headers, so the browser blocks the real request.
        raise ApiError(400, "cross-origin request not allowed by this server's CORS settings", code="cors_refused")
    headers.update({
        "Access-Control-Allow-Methods": method.upper() if ANY in policy.methods else ", ".join(policy.methods),
        "Access-Control-Max-Age": _PREFLIGHT_MAX_AGE_S,
    })
    requested = request.headers.get("Access-Control-Request-Headers")
    if requested:
        headers["Access-Control-Allow-Headers"] = policy.allow_headers(requested)
    return web.Response(status=204, headers=headers)


async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    policy: CorsPolicy = request.app[GATEWAY].config.cors
    origin = request.headers.get("Origin")
    if policy.enabled and origin and "Access-Control-Allow-Origin" not in response.headers:
        for name, value in policy.response_headers(origin).items():
            if name == "Vary" and response.headers.get("Vary"):
                value = f"{response.headers['Vary']}, {value}"  # keep what the response varies on already
            response.headers[name] = value
