"""One trace per request across two processes: the gateway's SERVER and CLIENT
spans and the backend's llm_request/queue/prefill/decode, exported over
OTLP/HTTP by both to the in-test receiver."""
from __future__ import annotations

import threading

from tests.observability_e2e.obs_e2e_support import CHAT, MODEL, Server, new_traceparent, run_server
from tests.utils.otlp_receiver import OTLPReceiver, ReceivedSpan

SERVER_SPAN = f"POST {CHAT}"
CLIENT_SPAN = "inference.GRPCInferenceService/ModelStreamInfer"


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{name}: {[(s.name, s.span_id) for s in spans]}"
    return found[0]


def _trace(server: Server, trace_id: str) -> list[ReceivedSpan]:
    """Every span of the trace, once the backend's llm_request (it is exported
    last: after the stream ended) and the gateway's server span are in."""
    rx = server.receiver
    assert rx is not None
    rx.wait_for_spans(name="llm_request", trace_id=trace_id)
    rx.wait_for_spans(name=SERVER_SPAN, trace_id=trace_id)
    return rx.find(trace_id=trace_id)


def test_streamed_chat_is_one_trace_with_client_parent_and_gen_ai_attributes(traced_server: Server) -> None:
    header, client_trace, client_span = new_traceparent()
    chunks = traced_server.stream_chat(
        {"messages": [{"role": "user", "content": "Trace this, please."}], "max_tokens": 12,
         "temperature": 0.7, "top_p": 0.9, "seed": 3, "ignore_eos": True, "logprobs": True,
         "stream_options": {"include_usage": True}},
        {"traceparent": header})
    streamed = sum(len((c["choices"][0].get("logprobs") or {}).get("content") or [])
                   for c in chunks if c["choices"])
    usage = chunks[-1]["usage"]
    assert streamed == usage["completion_tokens"] == 12

    spans = _trace(traced_server, client_trace)  # the client's trace id, end to end
    server, client = _one(spans, SERVER_SPAN), _one(spans, CLIENT_SPAN)
    llm, queue = _one(spans, "llm_request"), _one(spans, "queue")
    prefill, decode = _one(spans, "prefill"), _one(spans, "decode")

    # parents: client's span -> gateway server -> gateway client -> backend llm_request -> phases
    assert server.parent_span_id == client_span and server.kind == "SERVER"
    assert client.parent_span_id == server.span_id and client.kind == "CLIENT"
    assert llm.parent_span_id == client.span_id and llm.kind == "SERVER"
    assert {queue.parent_span_id, prefill.parent_span_id, decode.parent_span_id} == {llm.span_id}
    assert queue.end_ns <= prefill.start_ns + 1 and prefill.end_ns <= decode.start_ns + 1
    # two processes exported them
    assert server.resource["service.name"] == client.resource["service.name"] == "kvserve-gateway"
    assert llm.resource["service.name"] == decode.resource["service.name"] == "kvserve-backend"

    a = server.attributes
    assert a["gen_ai.request.model"] == MODEL and a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.max_tokens"] == 12
    assert a["gen_ai.request.temperature"] == 0.7 and a["gen_ai.request.top_p"] == 0.9
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"] > 0
    assert a["gen_ai.usage.output_tokens"] == streamed
    assert a["gen_ai.response.finish_reasons"] == ("length",)
    assert a["gen_ai.response.id"] == chunks[0]["id"]
    assert a["http.response.status_code"] == 200

    c = client.attributes
    assert c["rpc.system"] == "grpc" and c["rpc.service"] == "inference.GRPCInferenceService"
    assert c["rpc.method"] == "ModelStreamInfer" and c["rpc.grpc.status_code"] == 0
    assert client.start_ns >= server.start_ns and client.end_ns <= server.end_ns

    b = llm.attributes
    assert b["gen_ai.request.model"] == MODEL  # the name clients call it by, not Triton's model name
    assert b["kvserve.prefix_cache.hit_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert b["gen_ai.usage.output_tokens"] == 12 and b["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert b["gen_ai.response.finish_reasons"] == ("length",) and b["kvserve.num_preemptions"] == 0
    names = [e.name for e in llm.events]
    assert names[0] == "queued" and names[-1] == "finished" and "preempted" not in names
    first_token = llm.event("first_token").time_ns
    assert prefill.end_ns == first_token == decode.start_ns
    assert llm.event("queued").time_ns <= first_token <= llm.event("finished").time_ns


def test_without_client_traceparent_the_server_span_is_the_root(traced_server: Server) -> None:
    out = traced_server.chat({"messages": [{"role": "user", "content": "no parent"}], "max_tokens": 3})
    rx = traced_server.receiver
    assert rx is not None
    (server,) = rx.wait_for_spans(name=SERVER_SPAN, predicate=lambda s: s.attributes.get("gen_ai.response.id") == out["id"])
    assert server.parent_span_id is None
    (llm,) = rx.wait_for_spans(name="llm_request", trace_id=server.trace_id)
    client = _one(rx.find(trace_id=server.trace_id), CLIENT_SPAN)
    assert llm.parent_span_id == client.span_id and client.parent_span_id == server.span_id
    assert server.attributes["gen_ai.usage.output_tokens"] == out["usage"]["completion_tokens"]


def test_forced_preemption_shows_as_an_event(traced_server: Server) -> None:
    # 2 x (about 20 prompt + 90 output tokens) do not fit 8 blocks of 16 tokens at once.
    traces, outs = [new_traceparent() for _ in range(2)], [None, None]

    def run(i: int) -> None:
        outs[i] = traced_server.chat(
            {"messages": [{"role": "user", "content": f"Long story number {i}, go on."}], "max_tokens": 90,
             "ignore_eos": True, "temperature": 0}, {"traceparent": traces[i][0]})

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(o is not None and o["usage"]["completion_tokens"] == 90 for o in outs)

    llms = [_one(_trace(traced_server, trace_id), "llm_request") for _, trace_id, _ in traces]
    preempted = [s for s in llms if s.attributes["kvserve.num_preemptions"] > 0]
    assert preempted, [s.events for s in llms]
    for span in preempted:
        events = [e for e in span.events if e.name == "preempted"]
        assert len(events) == span.attributes["kvserve.num_preemptions"]
        assert span.event("queued").time_ns <= events[0].time_ns <= span.event("finished").time_ns
        assert span.attributes["gen_ai.usage.output_tokens"] == 90


def test_both_processes_flush_their_spans_at_shutdown(llama_dir: str) -> None:
    # A minute between batch exports: whatever arrives was flushed by the shutdown.
    env = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "60000"}
    header, trace_id, _ = new_traceparent()
    with OTLPReceiver() as rx:
        with run_server(llama_dir, ["--otlp-traces-endpoint", rx.endpoint], env, rx) as server:
            server.stream_chat({"messages": [{"role": "user", "content": "bye"}], "max_tokens": 4},
                               {"traceparent": header})
            assert rx.find(trace_id=trace_id) == []
        assert server.proc.returncode == 0
        names = {s.name for s in rx.wait_for_spans(trace_id=trace_id, count=6, timeout=5)}
    assert names == {SERVER_SPAN, CLIENT_SPAN, "llm_request", "queue", "prefill", "decode"}

