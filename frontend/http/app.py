"""Assemble the aiohttp application and start it on a socket."""
from __future__ import annotations

from aiohttp import web

from kvserve.frontend.http.cors import add_cors_headers, preflight
from kvserve.frontend.http.gateway import GATEWAY, Gateway
from kvserve.frontend.http.http_server import GatewayRunner
from kvserve.frontend.http.middleware import auth, errors, observe, trusted_host
from kvserve.frontend.openai import add_routes

# Streams end within this after shutdown begins; their Triton requests are cancelled.
SHUTDOWN_TIMEOUT_S = 5.0


def build_app(gateway: Gateway) -> web.Application:
    # client_max_size backs up the Content-Length check for chunked bodies.
    # CORS preflights are answered before the API-key check: browsers send them without the key;
    # the Host check comes first, so a rebound name gets nothing, not even a preflight.
    app = web.Application(middlewares=[observe, errors, trusted_host, preflight, auth],
                          client_max_size=gateway.config.max_request_body_bytes)
    app[GATEWAY] = gateway
    app.on_response_prepare.append(add_cors_headers)
    add_routes(app)

    async def close_backend(_: web.Application) -> None:
        await gateway.backend.close()
        if gateway.embedder is not None:
            await gateway.embedder.close()

    app.on_cleanup.append(close_backend)
    return app


async def start_app(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (for cleanup) and the bound port (port 0 picks one)."""
    # handler_cancellation: when a client disconnects, aiohttp cancels its handler
    # task, which is what cancels the Triton request of a non-streaming call
    # (nothing is written to it until the end, so no write would notice).
    # keepalive_timeout is also how long a connection may take to send a request's head: aiohttp
    # closes a connection still waiting for a complete head when it runs out (a slowloris client).
    config = app[GATEWAY].config
    runner = GatewayRunner(app, handler_cancellation=True, keepalive_timeout=config.header_timeout,
                           shutdown_timeout=SHUTDOWN_TIMEOUT_S, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    addresses = runner.addresses
    bound = int(addresses[0][1]) if addresses else port
    return runner, bound
