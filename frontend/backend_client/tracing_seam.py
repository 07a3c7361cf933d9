"""Where tracing plugs into the gateway, in one place: `start_server_span`
opens the SERVER span of an HTTP request (parented on the client's W3C
`traceparent`, if any); `start_client_span` opens the CLIENT span of each
Triton gRPC call under it, whose `traceparent` goes into the Triton request
parameters, so the backend's spans are children of the call;
`annotate_request`/`annotate_response` put the `gen_ai.*` attributes on the
server span. The span tree of one streamed chat request:

    POST /v1/chat/completions                          SERVER  (gateway)
    └── inference.GRPCInferenceService/ModelStreamInfer CLIENT  (gateway)
        └── llm_request                                SERVER  (backend)
            ├── queue / prefill / decode               INTERNAL
            └── events: queued, scheduled, first_token, preempted, finished

When tracing is not set up the tracer is a no-op; the client's traceparent is
then forwarded unchanged, so an outer trace still reaches the backend.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web
import structlog
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from kvserve.observability import semconv as sc
from kvserve.observability.tracing import extract_context, get_tracer, inject_traceparent

UNMATCHED_ROUTE = "unmatched"  # the route label of a request no route took (404, 405, CORS preflight)
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


@dataclass(slots=True)
class ServerSpan:
    span: trace.Span
    incoming: str | None  # the client's traceparent, validated

    def annotate(self, attributes: dict[str, Any]) -> None:
        self.span.set_attributes({k: v for k, v in attributes.items() if v is not None})

    def set_status(self, status: int) -> None:
        self.span.set_attribute("http.response.status_code", status)
        if status >= 500:  # a server span is an error only for 5xx; a 4xx is the client's (HTTP conventions)
            self.span.set_attribute("error.type", str(status))
            self.span.set_status(Status(StatusCode.ERROR))

    def end(self) -> None:
        self.span.end()


def start_server_span(request: web.Request, route: str) -> ServerSpan:
    header = request.headers.get("traceparent", "").strip().lower()
    incoming = header if _TRACEPARENT.match(header) else None
    carrier = {"traceparent": incoming} if incoming else {}
    if incoming and "tracestate" in request.headers:
        carrier["tracestate"] = request.headers["tracestate"][:512]
    attributes: dict[str, Any] = {
        "http.request.method": request.method, "url.path": request.path[:256], "url.scheme": request.scheme,
        "network.protocol.version": f"{request.version.major}.{request.version.minor}",
    }
    host, _, port = (request.host or "").rpartition(":")
    if host and port.isdigit():
        attributes.update({"server.address": host[:256], "server.port": int(port)})
    elif request.host:
        attributes["server.address"] = request.host[:256]
    if request.headers.get("User-Agent"):
        attributes["user_agent.original"] = request.headers["User-Agent"][:256]
    matched = route != UNMATCHED_ROUTE  # if not, the name is the method alone, and no http.route
    if matched:
        attributes["http.route"] = route
    span = get_tracer().start_span(
        f"{request.method} {route}" if matched else request.method,
        context=extract_context(carrier),
        kind=SpanKind.SERVER,
        attributes=attributes,
    )
    return ServerSpan(span=span, incoming=incoming)


def backend_traceparent(span: ServerSpan | None) -> str | None:
    """The `traceparent` request parameter for the Triton request."""
    if span is None:
        return None
    if span.span.get_span_context().is_valid:
        return inject_traceparent(ctx=trace.set_span_in_context(span.span)).get("traceparent")
    return span.incoming


# --- the Triton call: a CLIENT span around the gRPC stream ---------------------------------

RPC_SERVICE = "inference.GRPCInferenceService"
RPC_METHOD = "ModelStreamInfer"
X_REQUEST_ID_PARAM = "x_request_id"  # the gateway's log request id, so backend lines share it
GRPC_OK, GRPC_CANCELLED = 0, 1


class ClientSpan:
    """The CLIENT span of one Triton request (child of the current server span).

    Its context, not the server span's, is what the backend receives as
    `traceparent`, so the backend's `llm_request` hangs under this call.
    """

    def __init__(self, target: str, model: str, triton_request_id: str) -> None:
        host, _, port = target.rpartition(":")
        attributes: dict[str, Any] = {
            "rpc.system": "grpc", "rpc.service": RPC_SERVICE, "rpc.method": RPC_METHOD,
            "server.address": host or target, "kvserve.triton.model": model,
            "kvserve.triton.request_id": triton_request_id,
        }
        if port.isdigit():
            attributes["server.port"] = int(port)
        self.span = get_tracer().start_span(f"{RPC_SERVICE}/{RPC_METHOD}", kind=SpanKind.CLIENT, attributes=attributes)
        self._ended = False

    def parameters(self, fallback_traceparent: str | None) -> dict[str, str]:
        """String parameters for the Triton request: `traceparent` (this span's, or the
        fallback when tracing is off) and the request id of the current log context."""
        params: dict[str, str] = {}
        if self.span.get_span_context().is_valid:
            params.update(inject_traceparent(ctx=trace.set_span_in_context(self.span)))
        elif fallback_traceparent:
            params["traceparent"] = fallback_traceparent
        rid = structlog.contextvars.get_contextvars().get("request_id")
        if isinstance(rid, str) and rid:
            params[X_REQUEST_ID_PARAM] = rid
        return params

    def end(self, grpc_code: int | None, error: str | None = None) -> None:
        """grpc_code: the RPC's status code (0 OK, 1 CANCELLED ...); error: an in-band
        model error or transport failure (span status ERROR)."""
        if self._ended:
            return
        self._ended = True
        if grpc_code is not None:
            self.span.set_attribute("rpc.grpc.status_code", grpc_code)
        if error is not None:
            self.span.set_status(Status(StatusCode.ERROR, error[:256]))
        elif grpc_code not in (None, GRPC_OK):
            # OpenTelemetry's gRPC conventions: a client span is an error for every code but OK
            # (CANCELLED included: the gateway cancels the call when its HTTP client leaves).
            self.span.set_status(Status(StatusCode.ERROR, f"gRPC status {grpc_code}"))
        self.span.end()


def start_client_span(target: str, model: str, triton_request_id: str) -> ClientSpan:
    return ClientSpan(target, model, triton_request_id)


# --- gen_ai.* attributes on the server span ---------------------------------------------------

def annotate_request(span: ServerSpan | None, *, response_id: str, model: str, chat: bool,
                     sampling: dict[str, Any], lora_name: str | None = None) -> None:
    """What was asked: gen_ai.request.* (only the fields the client set), the response id, and
    the LoRA adapter the request runs with (kvserve.lora.name; absent for the base model)."""
    if span is None:
        return
    span.annotate({
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT if chat else sc.OPERATION_TEXT_COMPLETION,
        sc.GEN_AI_SYSTEM: sc.GEN_AI_SYSTEM_VALUE,
        sc.GEN_AI_PROVIDER_NAME: sc.GEN_AI_SYSTEM_VALUE,
        sc.GEN_AI_REQUEST_MODEL: model,
        sc.GEN_AI_RESPONSE_MODEL: model,
        sc.GEN_AI_RESPONSE_ID: response_id,
        sc.GEN_AI_REQUEST_MAX_TOKENS: sampling.get("max_tokens"),
        sc.GEN_AI_REQUEST_TEMPERATURE: _number(sampling.get("temperature")),
        sc.GEN_AI_REQUEST_TOP_P: _number(sampling.get("top_p")),
        sc.GEN_AI_REQUEST_TOP_K: sampling.get("top_k"),
        sc.GEN_AI_REQUEST_SEED: sampling.get("seed"),
        sc.GEN_AI_REQUEST_N: sampling.get("n"),
        sc.KVSERVE_LORA_NAME: lora_name,
    })


def annotate_response(span: ServerSpan | None, usage: dict[str, Any], finish_reasons: list[str | None]) -> None:
    """What came back: token usage (as reported to the client) and the finish reasons."""
    if span is None:
        return
    span.annotate({
        sc.GEN_AI_USAGE_INPUT_TOKENS: usage.get("prompt_tokens"),
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: usage.get("completion_tokens"),
        sc.GEN_AI_RESPONSE_FINISH_REASONS: [r for r in finish_reasons if r] or None,
    })


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def annotate_embeddings(span: ServerSpan | None, *, response_id: str, model: str, num_inputs: int,
                        input_tokens: int | None = None) -> None:
    """An embeddings call: gen_ai.operation.name "embeddings", its inputs and (once known) their tokens."""
    if span is None:
        return
    span.annotate({
        sc.GEN_AI_OPERATION_NAME: sc.OPERATION_EMBEDDINGS,
        sc.GEN_AI_SYSTEM: sc.GEN_AI_SYSTEM_VALUE,
        sc.GEN_AI_PROVIDER_NAME: sc.GEN_AI_SYSTEM_VALUE,
        sc.GEN_AI_REQUEST_MODEL: model,
        sc.GEN_AI_RESPONSE_MODEL: model,
        sc.GEN_AI_RESPONSE_ID: response_id,
        sc.KVSERVE_EMBEDDING_INPUTS: num_inputs,
        sc.GEN_AI_USAGE_INPUT_TOKENS: input_tokens,
    })
