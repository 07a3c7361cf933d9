"""Engine step listener: Prometheus metrics and after-the-fact trace spans.

Runs on the engine thread after every step (see AsyncEngine.step_listeners).
Counters are fed the difference of the engine's totals since the last step, so
the engine itself never knows a metric name.
"""
from __future__ import annotations

from kvserve.backend.engine import LLMEngine
from kvserve.backend.outputs import RequestOutput
from kvserve.observability import semconv as sc
from kvserve.observability.request_spans import RequestTimeline, record_request_spans

_COUNTERS = ("prompt_tokens_total", "generation_tokens_total", "num_preemptions_total",
             "prefix_cache_queries_total", "prefix_cache_hits_total")


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1e9)


class EngineTelemetry:
    def __init__(self, metrics, model_name: str) -> None:
        self.metrics = metrics  # observability.metrics_backend.BackendMetrics, or None
        self.model_name = model_name
        self._last = dict.fromkeys(_COUNTERS, 0)

    def __call__(self, engine: LLMEngine, outputs: list[RequestOutput], started: float) -> None:
        stats = engine.stats()
        if self.metrics is not None:
            self._record_metrics(engine, stats)
        for out in outputs:
            if out.finished and out.metrics is not None:
                self._finished(out)

    def _record_metrics(self, engine: LLMEngine, stats: dict) -> None:
        m = self.metrics
        m.on_step(stats["num_requests_running"], stats["num_requests_waiting"], stats["kv_cache_usage_perc"])
        delta = {k: stats[k] - self._last[k] for k in _COUNTERS}
        self._last = {k: stats[k] for k in _COUNTERS}
        m.on_prompt_tokens(delta["prompt_tokens_total"])
        m.on_generation_tokens(delta["generation_tokens_total"])
        m.on_preemptions(delta["num_preemptions_total"])
        m.on_prefix_cache(delta["prefix_cache_queries_total"], delta["prefix_cache_hits_total"])
        itl, engine.recent_itl = engine.recent_itl, []
        for gap in itl:
            m.on_token_latency(gap)

    def _finished(self, out: RequestOutput) -> None:
        rm = out.metrics
        reason = "error" if out.error else (rm.finish_reasons[-1] if rm.finish_reasons else "abort")
        if self.metrics is not None:
            queue_s = None if rm.first_scheduled is None else rm.first_scheduled - rm.arrival
            ttft_s = None if rm.first_token is None else rm.first_token - rm.arrival
            self.metrics.on_finished(reason, rm.finished - rm.arrival, queue_s, ttft_s)
        record_request_spans(
            rm.traceparent, out.request_id,
            RequestTimeline(queued_ns=_ns(rm.arrival), finished_ns=_ns(rm.finished),
                            scheduled_ns=_ns(rm.first_scheduled), first_token_ns=_ns(rm.first_token),
                            preempted_ns=[_ns(t) for t in rm.preemptions]),
            {sc.GEN_AI_REQUEST_MODEL: self.model_name, sc.GEN_AI_USAGE_INPUT_TOKENS: rm.num_prompt_tokens,
             sc.GEN_AI_USAGE_OUTPUT_TOKENS: rm.num_generated_tokens},
            finish_reason=reason, error=out.error)
