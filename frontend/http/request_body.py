"""Read a JSON request body with the checks every POST route shares:
415 unless the body is JSON, 413 when over the configured limit, 408 when it
does not arrive within the body timeout, 400 when it does not decode or parse or is not
an object."""
from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from aiohttp import web

from kvserve.frontend.openai import ApiError, bad_request


# A JSON escape of a UTF-16 surrogate: legal JSON, but a lone one is no Unicode
# text (it cannot be encoded as UTF-8 for the engine), so such bodies get a check.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def _has_lone_surrogate(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True
    except RecursionError:
        return False  # parsed fine, so json.loads bounded the depth; nothing more to check


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body is larger than {limit} bytes", code="request_too_large")


async def read_json_body(request: web.Request, limit: int, timeout: float | None = None) -> dict[str, Any]:
    ctype = request.content_type
    # No Content-Type at all is read as JSON (as vLLM's FastAPI does) for clients such as curl
    # and the SDKs; not from a web page (it sends Origin): there it is the mark of a "simple"
    # cross-site request, which browsers send without a CORS preflight.
    lenient = "Content-Type" not in request.headers and "Origin" not in request.headers
    if not lenient and ctype != "application/json" and not ctype.endswith("+json"):
        raise ApiError(415, "Content-Type must be application/json", code="unsupported_media_type")
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)  # refuse before reading a byte of it
    try:
        # The app's client_max_size bounds chunked bodies too; the timeout bounds a client that
        # sends a byte now and then to hold the connection (and its buffer) open.
        raw = await asyncio.wait_for(request.read(), timeout)
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(limit) from None
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s", code="body_timeout",
                       close_connection=True) from None
    except web.RequestPayloadError:
        # aiohttp decodes Content-Encoding (gzip, deflate, br) and chunked framing as it reads: a
        # body that is not what those headers say is the client's error, not a 500. Its text
        # (the decoder's) stays out of the reply; the rest of the body was dropped unread, so the
        # connection is closed rather than parsed on from the middle of it.
        raise ApiError(400, "request body could not be read: it is not encoded as its Content-Encoding "
                       "or Transfer-Encoding header says", close_connection=True) from None
    if len(raw) > limit:
        raise _too_large(limit)
    # Decoded here, strictly: json.loads(bytes) would guess UTF-16/32 from the first bytes and
    # decode with "surrogatepass", so raw bytes ED A0 80 (an encoded lone surrogate) came through
    # as text that nothing downstream can encode again. JSON on the wire is UTF-8 (RFC 8259).
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise bad_request("request body is not UTF-8 text (JSON must be sent as UTF-8)") from None
    try:
        body = json.loads(text)
    except ValueError:
        raise bad_request("request body is not valid JSON") from None
    except RecursionError:  # nested deeper than the parser's stack allows
        raise bad_request("request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(body):
        raise bad_request("request body holds an unpaired UTF-16 surrogate (not valid Unicode text)")
    return body
