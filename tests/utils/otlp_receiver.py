"""An in-test OTLP trace receiver: a stand-in for the OpenTelemetry Collector.

It listens on a free local port, decodes each ``ExportTraceServiceRequest``
with ``opentelemetry.proto`` and keeps the spans for assertions. Two
transports, the two the exporters speak:

* ``protocol="http/protobuf"`` (default): ``POST /v1/traces`` on a threaded
  ``http.server`` (gzip/deflate bodies accepted);
* ``protocol="grpc"``: ``TraceService/Export`` on a ``grpc`` server.

Usage::

    from tests.utils.otlp_receiver import OTLPReceiver

    with OTLPReceiver() as rx:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", rx.traces_endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", rx.protocol)
        ...                                    # run the code under test
        (req,) = rx.wait_for_spans(name="llm_request")
        assert req.parent_span_id == gateway_span.span_id
        assert rx.children_of(req) ...

or the ``otlp_receiver`` fixture below (``from tests.utils.otlp_receiver
import otlp_receiver`` in a test module or conftest makes it available).

Spans are ``ReceivedSpan`` records: ids as lowercase hex (``trace_id`` 32
chars, ``span_id`` 16, ``parent_span_id`` None for a root), ``attributes`` as a
plain dict (arrays become tuples), ``events``, ``start_ns``/``end_ns``, kind and
status as names (``"SERVER"``, ``"ERROR"``), and the resource attributes
(``service.name`` ...). The receiver is thread-safe and works the same from
sync and asyncio tests (``wait_for_spans`` blocks; in async code call it
through ``asyncio.to_thread``).
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

__all__ = ["OTLPReceiver", "ReceivedEvent", "ReceivedSpan", "otlp_receiver"]


@dataclass(frozen=True, slots=True)
class ReceivedEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str  # INTERNAL, SERVER, CLIENT, PRODUCER, CONSUMER, UNSPECIFIED
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: tuple[ReceivedEvent, ...]
    status_code: str  # UNSET, OK, ERROR
    status_message: str
    scope: str
    resource: dict[str, Any]

    def event(self, name: str) -> ReceivedEvent:
        """The first event called name (KeyError if none)."""
        for ev in self.events:
            if ev.name == name:
                return ev
        raise KeyError(f"span {self.name!r} has no event {name!r}; has {[e.name for e in self.events]}")


def _value(v: common_pb2.AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    if which == "kvlist_value":
        return _attrs(v.kvlist_value.values)
    return getattr(v, which)


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _enum_suffix(enum_name: str, prefix: str) -> str:
    return enum_name[len(prefix):] if enum_name.startswith(prefix) else enum_name


def decode_request(request: trace_service_pb2.ExportTraceServiceRequest) -> list[ReceivedSpan]:
    """All spans of one export request, flattened."""
    out: list[ReceivedSpan] = []
    for rs in request.resource_spans:
        resource = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(ReceivedSpan(
                    trace_id=s.trace_id.hex(),
                    span_id=s.span_id.hex(),
                    parent_span_id=s.parent_span_id.hex() or None,
                    name=s.name,
                    kind=_enum_suffix(trace_pb2.Span.SpanKind.Name(s.kind), "SPAN_KIND_"),
                    start_ns=s.start_time_unix_nano,
                    end_ns=s.end_time_unix_nano,
                    attributes=_attrs(s.attributes),
                    events=tuple(ReceivedEvent(e.name, e.time_unix_nano, _attrs(e.attributes)) for e in s.events),
                    status_code=_enum_suffix(trace_pb2.Status.StatusCode.Name(s.status.code), "STATUS_CODE_"),
                    status_message=s.status.message,
                    scope=ss.scope.name,
                    resource=resource,
                ))
    return out


class OTLPReceiver:
    """Collects spans exported over OTLP; see the module docstring."""

    def __init__(self, protocol: str = "http/protobuf", host: str = "127.0.0.1", port: int = 0) -> None:
        if protocol not in ("http/protobuf", "grpc"):
            raise ValueError(f"protocol must be 'http/protobuf' or 'grpc', not {protocol!r}")
        self.protocol = protocol
        self.host = host
        self.port = port
        self.export_requests = 0  # number of Export calls received
        self._spans: list[ReceivedSpan] = []
        self._cond = threading.Condition()
        self._http: ThreadingHTTPServer | None = None
        self._grpc: Any = None

    # --- lifecycle ---

    def start(self) -> OTLPReceiver:
        if self.protocol == "grpc":
            self._start_grpc()
        else:
            self._start_http()
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._grpc is not None:
            self._grpc.stop(grace=None)
            self._grpc = None

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """Base URL, for ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``--otlp-traces-endpoint``."""
        return f"http://{self.host}:{self.port}"

    @property
    def traces_endpoint(self) -> str:
        """Signal URL, for ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (gRPC has no path)."""
        return self.endpoint + ("/v1/traces" if self.protocol == "http/protobuf" else "")

    # --- results ---

    def _add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        spans = decode_request(request)
        with self._cond:
            self.export_requests += 1
            self._spans.extend(spans)
            self._cond.notify_all()

    @property
    def spans(self) -> list[ReceivedSpan]:
        """A snapshot of every span received so far, in arrival order."""
        with self._cond:
            return list(self._spans)

    def clear(self) -> None:
        with self._cond:
            self._spans.clear()
            self.export_requests = 0

    def find(self, name: str | None = None, trace_id: str | None = None,
             predicate: Callable[[ReceivedSpan], bool] | None = None) -> list[ReceivedSpan]:
        """Received spans matching all the given filters."""
        return [s for s in self.spans
                if (name is None or s.name == name) and (trace_id is None or s.trace_id == trace_id)
                and (predicate is None or predicate(s))]

    def children_of(self, parent: ReceivedSpan) -> list[ReceivedSpan]:
        """Direct children of parent, ordered by start time."""
        kids = self.find(trace_id=parent.trace_id, predicate=lambda s: s.parent_span_id == parent.span_id)
        return sorted(kids, key=lambda s: s.start_ns)

    def wait_for_spans(self, name: str | None = None, count: int = 1, timeout: float = 10.0,
                       trace_id: str | None = None,
                       predicate: Callable[[ReceivedSpan], bool] | None = None) -> list[ReceivedSpan]:
        """Block until at least count matching spans arrived; return them all.

        Raises TimeoutError listing what did arrive. Exporters batch: call
        ``flush_tracing()`` in the process under test, or allow for
        ``OTEL_BSP_SCHEDULE_DELAY`` (5 s by default) in timeout.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = self.find(name, trace_id, predicate)  # the Condition's lock is an RLock
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    got = sorted({s.name for s in self._spans})
                    raise TimeoutError(f"wanted {count} span(s) name={name!r}, got {len(found)}; "
                                       f"received names: {got}")
                self._cond.wait(left)

    # --- transports ---

    def _start_http(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                if self.path.rstrip("/") != "/v1/traces":
                    self.send_error(404)
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if "protobuf" not in (self.headers.get("Content-Type") or ""):
                    self.send_error(415, "only application/x-protobuf")
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._add(request)
                payload = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

        self._http = ThreadingHTTPServer((self.host, self.port), Handler)
        self._http.daemon_threads = True
        self.port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, name="otlp-receiver", daemon=True).start()

    def _start_grpc(self) -> None:
        import grpc

        receiver = self

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC API)
                receiver._add(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), server)
        self.port = server.add_insecure_port(f"{self.host}:{self.port}")
        server.start()
        self._grpc = server


def _fixture() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as rx:
        yield rx


try:  # a fixture when pytest is around; the module stays importable without it
    import pytest

    otlp_receiver = pytest.fixture(_fixture, name="otlp_receiver")
except ImportError:  # pragma: no cover
    otlp_receiver = None  # type: ignore[assignment]
