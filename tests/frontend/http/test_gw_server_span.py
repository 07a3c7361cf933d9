"""The gateway's HTTP SERVER span carries OpenTelemetry's HTTP server attributes."""
from __future__ import annotations

from aiohttp.test_utils import make_mocked_request
from opentelemetry.trace import StatusCode

from kvserve.frontend.backend_client.tracing_seam import UNMATCHED_ROUTE, start_server_span
from kvserve.observability.tracing import setup_tracing


def test_server_span_attributes_and_status() -> None:
    setup_tracing()
    request = make_mocked_request("POST", "/v1/completions",
                                  headers={"Host": "127.0.0.1:8123", "User-Agent": "OpenAI/Python 1.0"})
    span = start_server_span(request, "/v1/completions")
    span.set_status(400)
    span.end()
    a = span.span.attributes
    assert span.span.name == "POST /v1/completions" and a["http.route"] == "/v1/completions"
    assert a["url.scheme"] == "http" and a["network.protocol.version"] == "1.1"
    assert a["server.address"] == "127.0.0.1" and a["server.port"] == 8123
    assert a["user_agent.original"] == "OpenAI/Python 1.0"
    assert "error.type" not in a and span.span.status.status_code == StatusCode.UNSET  # 4xx: the client's


def test_a_request_no_route_matched_is_named_by_its_method_alone() -> None:
    setup_tracing()
    span = start_server_span(make_mocked_request("GET", "/nope", headers={"Host": "localhost"}), UNMATCHED_ROUTE)
    span.set_status(500)
    span.end()
    assert span.span.name == "GET" and "http.route" not in span.span.attributes
    assert span.span.attributes["server.address"] == "localhost"
    assert span.span.status.status_code == StatusCode.ERROR and span.span.attributes["error.type"] == "500"
