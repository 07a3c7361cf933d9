"""configure_logging: JSON lines, request-scoped ids, prompt redaction."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading

import pytest

from kvserve.observability import (
    configure_logging,
    get_logger,
    get_tracer,
    inject_traceparent,
    log_requests_enabled,
    request_context,
    request_text,
    request_text_fields,
    setup_tracing,
)
from kvserve.observability import logging as obs_logging


@pytest.fixture
def stream() -> io.StringIO:
    return io.StringIO()


def _lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_every_line_in_a_request_carries_request_and_trace_id(stream):
    setup_tracing()  # no exporter, but spans (and ids) exist
    configure_logging(stream=stream, level="DEBUG")
    log = get_logger("kvserve.frontend")
    with get_tracer().start_as_current_span("gateway") as span:
        with request_context("req-1", route="/v1/chat/completions"):
            log.info("accepted", n=1)
            logging.getLogger("aiohttp.access").warning("stdlib %s", "line")
            with get_tracer().start_as_current_span("triton-call"):
                log.debug("sending")
            log.info("done")
    log.info("outside")

    trace_id = f"{span.get_span_context().trace_id:032x}"
    *inside, outside = _lines(stream)
    assert [r["event"] for r in inside] == ["accepted", "stdlib line", "sending", "done"]
    for record in inside:
        assert record["request_id"] == "req-1"
        assert record["trace_id"] == trace_id
        assert record["route"] == "/v1/chat/completions"
        assert "span_id" in record and "timestamp" in record and "level" in record
    assert inside[1]["logger"] == "aiohttp.access" and inside[1]["level"] == "warning"
    assert inside[2]["span_id"] != inside[0]["span_id"]  # the current span, not the bound one
    assert "request_id" not in outside and "trace_id" not in outside


def test_backend_thread_binds_trace_id_from_traceparent(stream):
    setup_tracing()
    configure_logging(stream=stream)
    with get_tracer().start_as_current_span("gateway") as span:
        tp = inject_traceparent()["traceparent"]

    def engine_thread() -> None:  # no current span here
        with request_context("req-7", traceparent=tp):
            get_logger("kvserve.backend").info("scheduled")
            logging.getLogger("kvserve.backend.engine.engine").info("finished")

    t = threading.Thread(target=engine_thread)
    t.start()
    t.join()
    records = _lines(stream)
    assert len(records) == 2
    assert {r["request_id"] for r in records} == {"req-7"}
    assert {r["trace_id"] for r in records} == {f"{span.get_span_context().trace_id:032x}"}


def test_concurrent_requests_do_not_leak_context(stream):
    configure_logging(stream=stream)
    log = get_logger("gw")

    async def handle(request_id: str) -> None:
        with request_context(request_id, trace_id=request_id * 4):
            for step in range(5):
                log.info("step", step=step)
                await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(handle("a"), handle("b"), handle("c"))

    asyncio.run(main())
    records = _lines(stream)
    assert len(records) == 15
    for record in records:
        assert record["trace_id"] == record["request_id"] * 4
    assert {r["request_id"] for r in records} == {"a", "b", "c"}


def test_prompts_and_outputs_are_not_logged_by_default(stream):
    configure_logging(stream=stream)
    assert not log_requests_enabled()
    log = get_logger("gw")
    assert request_text("secret prompt") is None
    assert request_text_fields(prompt="secret prompt") == {}
    with request_context("r"):
        log.info("request", prompt_tokens=3, **request_text_fields(prompt="secret prompt"))
        log.info("careless", prompt="secret prompt", messages=[{"content": "secret prompt"}],
                 output_text="secret output")
        logging.getLogger("lib").info("careless stdlib", extra={"prompt": "secret prompt"})
    text = stream.getvalue()
    assert "secret" not in text
    records = _lines(stream)
    assert records[0]["prompt_tokens"] == 3 and "prompt" not in records[0]
    assert records[1]["prompt"] == records[1]["messages"] == records[1]["output_text"] == "<redacted>"
    assert records[2]["prompt"] == "<redacted>" and records[2]["request_id"] == "r"


def test_log_requests_switch_enables_prompt_logging(stream, monkeypatch):
    monkeypatch.setenv("KVSERVE_LOG_REQUESTS", "1")
    configure_logging(stream=stream)
    assert log_requests_enabled()
    get_logger("gw").info("request", **request_text_fields(prompt="hello there"))
    assert _lines(stream)[0]["prompt"] == "hello there"
    configure_logging(stream=stream, log_requests=False)  # argument beats env
    assert request_text("x") is None


def _log_a_failure(secret: str, quoted: bool) -> None:
    header = "Authorization: " + secret  # a local variable of the failing frame
    try:
        # aiohttp's parser errors quote the raw request in their message
        raise ValueError("bad request " + (header if quoted else ""))
    except ValueError:
        get_logger("gw").exception("request failed")
        logging.getLogger("lib").exception("stdlib failed")


def test_above_debug_an_exception_is_logged_by_its_type_only(stream):
    configure_logging(stream=stream)
    _log_a_failure("Bearer sk-SECRET", quoted=True)
    records = _lines(stream)
    assert len(records) == 2
    for record in records:
        assert record["level"] == "error" and record["exception_type"] == "ValueError"
        assert "exception" not in record
    assert "sk-SECRET" not in stream.getvalue() and ".py" not in stream.getvalue()


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_at_debug_the_traceback_is_logged_without_local_variables(fmt, stream):
    configure_logging(stream=stream, level="DEBUG", fmt=fmt)
    _log_a_failure("Bearer sk-SECRET", quoted=False)
    text = stream.getvalue()
    assert "ValueError" in text and "test_obs_logging.py" in text  # the traceback is there
    assert "sk-SECRET" not in text  # the frame's local variables are not
    if fmt == "json":
        structlog_rec, stdlib_rec = _lines(stream)
        for record in (structlog_rec, stdlib_rec):
            assert record["exception"][0]["exc_type"] == "ValueError"
            assert all("locals" not in frame or not frame["locals"] for frame in record["exception"][0]["frames"])


def test_console_format_and_reconfiguration_do_not_stack_handlers(stream):
    configure_logging(stream=io.StringIO())
    configure_logging(fmt="console", stream=stream)
    ours = [h for h in logging.getLogger().handlers if isinstance(h, obs_logging._KvserveHandler)]
    assert len(ours) == 1
    with request_context("req-9"):
        get_logger("gw").info("hello console")
    line = stream.getvalue()
    assert "hello console" in line and "request_id=req-9" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)
    with pytest.raises(ValueError):
        configure_logging(fmt="xml")


def test_level_filters_both_paths(stream):
    configure_logging(stream=stream, level="WARNING")
    get_logger("gw").info("quiet")
    logging.getLogger("lib").info("quiet too")
    get_logger("gw").warning("loud")
    assert [r["event"] for r in _lines(stream)] == ["loud"]
