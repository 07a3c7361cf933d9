"""structlog configuration: one renderer for structlog and stdlib logging.

* JSON lines by default (``format="console"`` for humans), on stderr.
* ``request_context(request_id, ...)`` binds ``request_id`` and ``trace_id``
  in a contextvar, so every line logged inside it (structlog or stdlib, in
  this task/thread) carries them; ``trace_id``/``span_id`` of the current
  OpenTelemetry span are added to any line logged while a span is current.
* Prompts and outputs are not logged unless ``log_requests=True``: callers go
  through ``request_text()`` / ``request_text_fields()``, and as a safety net
  the well-known text keys (``SENSITIVE_KEYS``) are replaced by
  ``"<redacted>"`` in every record while the switch is off.
* Exceptions: at DEBUG the traceback is rendered into the record (``exception``
  field), without local variables; above DEBUG only the exception's type name
  (``exception_type``). Neither a traceback's paths nor an exception's message
  (which may quote a request: aiohttp's parser errors quote the raw bytes,
  Authorization header included) reach the logs at the default level. These
  records are for operators, never for HTTP clients.

Environment defaults (so a child process inherits its parent's choice):
``KVSERVE_LOG_FORMAT`` (json|console), ``KVSERVE_LOG_LEVEL``,
``KVSERVE_LOG_REQUESTS`` (1/true/yes).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO, TypeVar

import structlog
from opentelemetry import trace
from structlog.tracebacks import ExceptionDictTransformer
from structlog.typing import EventDict, WrappedLogger

from .tracing import format_span_id, format_trace_id, span_context_from_traceparent

T = TypeVar("T")
FORMATS = ("json", "console")
REDACTED = "<redacted>"
SENSITIVE_KEYS = frozenset({
    "prompt", "prompts", "prompt_text", "messages", "input_text",
    "output_text", "completion", "completion_text", "generated_text",
})

_log_requests = False


class _KvserveHandler(logging.StreamHandler):
    """Marks the one root handler we own, so reconfiguring replaces it.

    Without an explicit stream it writes to whatever sys.stderr is at emit time,
    so a replaced stderr (pytest's capture, a daemonised process) never leaves it
    holding a closed file.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream if stream is not None else sys.stderr)
        self._follow_stderr = stream is None

    def emit(self, record: logging.LogRecord) -> None:
        if self._follow_stderr:
            self.stream = sys.stderr
        super().emit(record)


def _add_trace_ids(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    span_ctx = trace.get_current_span().get_span_context()
    if span_ctx.is_valid:
        event_dict.setdefault("trace_id", format_trace_id(span_ctx.trace_id))
        event_dict.setdefault("span_id", format_span_id(span_ctx.span_id))
    return event_dict


def _redact(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    if not _log_requests:
        for key in SENSITIVE_KEYS & event_dict.keys():
            event_dict[key] = REDACTED
    return event_dict


def _exception_type_unless_debugging(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    exc_info = event_dict.get("exc_info")
    if not exc_info or logging.getLogger().isEnabledFor(logging.DEBUG):
        return event_dict
    del event_dict["exc_info"]
    if exc_info is True:
        exc_info = sys.exc_info()
    exc = exc_info if isinstance(exc_info, BaseException) else exc_info[1]
    if exc is not None:
        event_dict["exception_type"] = type(exc).__name__
    return event_dict


# Tracebacks (DEBUG only) without local variables: a frame's locals can hold a request's bytes.
_json_traceback = structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False))


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def configure_logging(*, fmt: str | None = None, level: str | int | None = None,
                      log_requests: bool | None = None, stream: TextIO | None = None) -> None:
    """Configure structlog and the root stdlib logger; safe to call again.

    A later call replaces the previous configuration (our handler is swapped,
    never stacked); handlers installed by others (pytest's caplog) are kept.
    """
    global _log_requests
    fmt = (fmt or os.environ.get("KVSERVE_LOG_FORMAT") or "json").lower()
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}, got {fmt!r}")
    level = level if level is not None else os.environ.get("KVSERVE_LOG_LEVEL", "INFO")
    if isinstance(level, str):
        level = logging.getLevelName(level.upper())
        if not isinstance(level, int):
            raise ValueError(f"unknown log level {level!r}")
    _log_requests = _env_flag("KVSERVE_LOG_REQUESTS") if log_requests is None else bool(log_requests)
    explicit_stream = stream
    stream = stream if stream is not None else sys.stderr

    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.PositionalArgumentsFormatter(),
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_trace_ids,
        _redact,
        _exception_type_unless_debugging,
        structlog.processors.StackInfoRenderer(),
    ]
    if fmt == "json":
        renderers: list[Any] = [_json_traceback, structlog.processors.JSONRenderer()]
    else:
        colors = bool(getattr(stream, "isatty", lambda: False)())
        renderers = [structlog.dev.ConsoleRenderer(colors=colors, exception_formatter=structlog.dev.plain_traceback)]
    formatter = structlog.stdlib.ProcessorFormatter(
        # ExtraAdder: stdlib `extra={...}` fields become keys (and get redacted too).
        foreign_pre_chain=[structlog.stdlib.ExtraAdder(), *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderers],
    )
    handler = _KvserveHandler(explicit_stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _KvserveHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)

    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, *shared,
                    structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # Not cached: a reconfiguration must reach loggers created earlier.
        cache_logger_on_first_use=False,
    )


def logging_configured() -> bool:
    """True once ``configure_logging`` ran in this process (and was not undone)."""
    return any(isinstance(h, _KvserveHandler) for h in logging.getLogger().handlers)


def get_logger(name: str | None = None, **initial: Any) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name, **initial)


@contextmanager
def request_context(request_id: str, *, traceparent: str | None = None,
                    trace_id: str | None = None, **fields: Any) -> Iterator[None]:
    """Bind request_id (+ trace_id, + fields) to every line logged inside.

    trace_id comes from, in order: the argument, the traceparent (backend
    threads, which have no current span), the current OTel span. Contextvars
    follow asyncio tasks; a plain thread needs its own ``request_context``.
    """
    if trace_id is None:
        span_ctx = (span_context_from_traceparent(traceparent) if traceparent
                    else trace.get_current_span().get_span_context())
        if span_ctx is not None and span_ctx.is_valid:
            trace_id = format_trace_id(span_ctx.trace_id)
    bound = {"request_id": request_id, **fields}
    if trace_id is not None:
        bound["trace_id"] = trace_id
    with structlog.contextvars.bound_contextvars(**bound):
        yield


def log_requests_enabled() -> bool:
    return _log_requests


def request_text(value: T) -> T | None:
    """value if prompt/output logging is enabled, else None."""
    return value if _log_requests else None


def request_text_fields(**fields: Any) -> dict[str, Any]:
    """fields if prompt/output logging is enabled, else {}: ``log.info("x", **request_text_fields(prompt=p))``."""
    return dict(fields) if _log_requests else {}
