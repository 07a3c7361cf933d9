"""aiohttp's HTTP server with two changes:
- a request its HTTP parser refuses (a bad method, an over-long header line, a bad chunk size) is
  answered with an OpenAI error object that quotes nothing of it. aiohttp's own plain-text answer
  quotes the offending bytes back;
- a body that does not decode (Content-Encoding or chunked framing) is logged at debug level, not
  as an unhandled error. The handler has answered it with a 400 (request_body.py); aiohttp then
  reads the rest of the body before it closes the connection, meets the same fault, and would log
  it with a traceback at error level, once for every such request a client cares to send.

aiohttp has no setting for the connection class: `web.Server.__call__` builds a
`RequestHandler` per connection. So the runner's Server becomes a subclass that builds ours.
"""
from __future__ import annotations

from http import HTTPStatus

from aiohttp import web

from kvserve.frontend.openai import ApiError


def _parser_error(status: int) -> ApiError:
    if status == 400:
        return ApiError(400, "malformed HTTP request", code="bad_http_request")
    try:
        return ApiError(status, HTTPStatus(status).phrase)
    except ValueError:
        return ApiError(status, "request failed")


class _Connection(web.RequestHandler):
    def log_exception(self, *args, **kwargs) -> None:
        error = kwargs.get("exc_info")
        if isinstance(error, web.RequestPayloadError):
            self.logger.debug("a request body did not decode: %s", type(error).__name__)
            return
        super().log_exception(*args, **kwargs)

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # super() logs the error (observability/logging.py keeps only its type above DEBUG) and
        # raises when part of a response is already sent; its body is what is replaced.
        super().handle_error(request, status, exc, message)
        response = _parser_error(status).to_response()
        response.force_close()  # as aiohttp does: after a parser error the stream is not trusted
        return response


class _Server(web.Server):
    def __call__(self) -> web.RequestHandler:
        return _Connection(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # same state, one method more: see the module docstring
        return server
