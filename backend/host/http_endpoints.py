"""The HTTP side of the host: Prometheus text at /metrics and the KServe health
routes (/v2/health/live, /v2/health/ready) that Kubernetes probes use.

tritonserver serves health on its HTTP port and metrics on :8002; the embedded
host has no HTTP inference API, so both live on the metrics port. A few GET
routes do not justify an HTTP framework: this is a minimal HTTP/1.1 server
that answers one request per connection.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from prometheus_client.core import CollectorRegistry

from .host_metrics import render_text

_LOG = logging.getLogger("kvserve.host")
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class HttpEndpoints:
    def __init__(self, registry: CollectorRegistry, live: Callable[[], bool], ready: Callable[[], bool]) -> None:
        self._registry = registry
        self._live = live
        self._ready = ready
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._handle, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _route(self, method: str, path: str) -> tuple[int, str, bytes]:
        path = path.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n"
        if path == "/metrics":
            return 200, METRICS_CONTENT_TYPE, render_text(self._registry)
        if path == "/v2/health/live":
            # Status only, empty body: what tritonserver returns for these routes.
            return (200 if self._live() else 400), "text/plain", b""
        if path == "/v2/health/ready":
            return (200 if self._ready() else 400), "text/plain", b""
        return 404, "text/plain", b"not found\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10.0)
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = request_line.split()
            if len(parts) < 2:
                status, ctype, body = 400, "text/plain", b"bad request\n"
                method = "GET"
            else:
                method = parts[0]
                status, ctype, body = self._route(method, parts[1])
            header = (f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: {ctype}\r\n"
                      f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
            writer.write(header.encode("latin-1") + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
            pass
        except Exception:
            _LOG.exception("HTTP request failed")
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass
