"""After a known workload, the gateway's /metrics (its own HTTP metrics, then the
backend's) moves by exactly the known token and request counts."""
from __future__ import annotations

import time

from tests.observability_e2e.obs_e2e_support import CHAT, Server, metric_value

WORKLOAD = [  # (prompt, max_tokens, stream)
    ("Count the apples.", 5, False),
    ("Name three rivers.", 7, True),
    ("Describe the sea at night.", 9, True),
]
BACKEND = ("kvserve:prompt_tokens_total", "kvserve:generation_tokens_total",
           "kvserve:time_to_first_token_seconds_count", "kvserve:e2e_request_latency_seconds_count",
           "kvserve:inter_token_latency_seconds_count", "kvserve:request_queue_time_seconds_count",
           "kvserve:request_prefill_time_seconds_count", "kvserve:request_decode_time_seconds_count",
           "kvserve:request_inference_time_seconds_count", "kvserve:request_prompt_tokens_count",
           "kvserve:request_prompt_tokens_sum", "kvserve:request_generation_tokens_sum",
           "kvserve:iteration_tokens_total_sum", "kvserve:request_params_n_sum", "kvserve:request_params_max_tokens_sum",
           "kvserve:request_max_num_generation_tokens_sum", "kvserve:request_time_per_output_token_seconds_count")


def _snapshot(text: str) -> dict[tuple, float]:
    snap = {(name,): metric_value(text, name) for name in BACKEND}
    snap[("success", "length")] = metric_value(text, "kvserve:request_success_total", finished_reason="length")
    for status in ("200", "400"):
        snap[("http", status)] = metric_value(text, "kvserve:http_requests_total", route=CHAT, status=status)
    snap[("http", "404")] = metric_value(text, "kvserve:http_requests_total", route="unmatched", status="404")
    snap[("duration",)] = metric_value(text, "kvserve:http_request_duration_seconds_count", route=CHAT)
    return snap


def test_counters_and_histograms_match_a_known_workload(traced_server: Server) -> None:
    before = _snapshot(traced_server.metrics())
    prompt_tokens = generated = cached = 0
    for prompt, max_tokens, stream in WORKLOAD:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0}
        if stream:
            chunks = traced_server.stream_chat({**body, "stream_options": {"include_usage": True}})
            usage = chunks[-1]["usage"]
        else:
            usage = traced_server.chat(body)["usage"]
        assert usage["completion_tokens"] == max_tokens
        prompt_tokens += usage["prompt_tokens"]
        generated += usage["completion_tokens"]
        cached += usage["prompt_tokens_details"]["cached_tokens"]
    assert traced_server.request("POST", CHAT, {"messages": [], "max_tokens": 1})[0] == 400
    assert traced_server.request("GET", "/no/such/route")[0] == 404

    n = len(WORKLOAD)
    expected = {
        ("kvserve:prompt_tokens_total",): prompt_tokens,
        ("kvserve:generation_tokens_total",): generated,
        ("success", "length"): n,
        ("kvserve:time_to_first_token_seconds_count",): n,
        ("kvserve:e2e_request_latency_seconds_count",): n,
        ("kvserve:request_queue_time_seconds_count",): n,
        ("kvserve:inter_token_latency_seconds_count",): generated - n,
        # vLLM's per-request phases and sizes: one observation each per request
        ("kvserve:request_prefill_time_seconds_count",): n,
        ("kvserve:request_decode_time_seconds_count",): n,
        ("kvserve:request_inference_time_seconds_count",): n,
        ("kvserve:request_prompt_tokens_count",): n,
        ("kvserve:request_prompt_tokens_sum",): prompt_tokens,
        ("kvserve:request_generation_tokens_sum",): generated,
        # one request at a time: each prompt's uncached tokens (its first token comes of them),
        # then one token a step for each token after the first
        ("kvserve:iteration_tokens_total_sum",): prompt_tokens - cached + generated - n,
        ("kvserve:request_params_n_sum",): n,
        ("kvserve:request_params_max_tokens_sum",): sum(w[1] for w in WORKLOAD),
        ("kvserve:request_max_num_generation_tokens_sum",): generated,
        ("kvserve:request_time_per_output_token_seconds_count",): n,  # each made more than one token
        ("http", "200"): n,
        ("http", "400"): 1,
        ("http", "404"): 1,
        ("duration",): n + 1,
    }
    # The engine records a finished request's metrics right after handing out its
    # last token, so the client may be a moment ahead of /metrics.
    deadline = time.monotonic() + 5
    while True:
        text = traced_server.metrics()
        after = _snapshot(text)
        delta = {k: after[k] - before[k] for k in expected}
        if delta == expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert delta == expected

    # One exposition: the gateway's families first, then the backend's, each declared once.
    assert text.index("# TYPE kvserve:http_requests_total") < text.index("# TYPE kvserve:prompt_tokens_total")
    assert text.count("# TYPE kvserve:prompt_tokens_total") == 1
    assert "_created" not in text  # no creation-time gauge beside each counter and histogram
    info = next(line for line in text.splitlines() if line.startswith("kvserve:cache_config_info{"))
    assert 'block_size="16"' in info and 'num_gpu_blocks="9"' in info and info.endswith(" 1")  # as configured
