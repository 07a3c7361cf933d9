"""Engine step listener: Prometheus metrics and after-the-fact trace spans;
and `RequestLog`, the request-scoped log lines of the Triton model.

The listener runs on the engine thread after every step (see
AsyncEngine.step_listeners). Counters are fed the difference of the engine's
totals since the last step, so the engine itself never knows a metric name.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass

from kvserve.backend.engine import EngineStats, RequestOutput
from kvserve.backend.triton.model_tensors import request_parameter
from kvserve.observability import semconv as sc
from kvserve.observability.logging import log_requests_enabled, request_context
from kvserve.observability.request_spans import RequestTimeline, record_request_spans

request_log = logging.getLogger("kvserve.backend.requests")
# Triton request parameter with the gateway's request id (X-Request-Id), so that
# the backend's lines of a request carry the same request_id as the gateway's.
X_REQUEST_ID_PARAM = "x_request_id"

def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1e9)


class EngineTelemetry:
    def __init__(self, metrics, model_name: str, max_loras: int = 0) -> None:
        self.metrics = metrics  # observability.metrics_backend.BackendMetrics, or None
        self.model_name = model_name
        self.max_loras = max_loras
        self._last: EngineStats | None = None  # the totals already counted
        # request id -> its LoRA adapter, from execute() (Triton's threads) to the engine thread's
        # _finished, for the span attribute (RequestOutput does not carry the adapter).
        self._adapters: dict[str, str] = {}
        self._adapters_lock = threading.Lock()
        self._lora_info: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._lora_info_at = 0.0

    def request_adapter(self, request_id: str, lora_name: str | None) -> None:
        """Before the request is queued: the adapter it runs with (None forgets it)."""
        with self._adapters_lock:
            if lora_name is None:
                self._adapters.pop(request_id, None)
            else:
                self._adapters[request_id] = lora_name

    def __call__(self, stats: EngineStats, outputs: list[RequestOutput], started: float) -> None:
        if self.metrics is not None:
            self._record_metrics(stats)
        for out in outputs:
            if out.finished:
                with self._adapters_lock:
                    adapter = self._adapters.pop(out.request_id, None)
                if out.metrics is not None:
                    self._finished(out, adapter)

    def _record_metrics(self, stats: EngineStats) -> None:
        m, last = self.metrics, self._last
        self._last = stats
        m.on_step(stats.num_requests_running, stats.num_requests_waiting, stats.kv_cache_usage_perc,
                  stats.num_grammar_matchers, stats.kv_cache_touched_bytes)
        m.on_prompt_tokens(stats.prompt_tokens_total - (last.prompt_tokens_total if last else 0))
        m.on_generation_tokens(stats.generation_tokens_total - (last.generation_tokens_total if last else 0))
        m.on_preemptions(stats.num_preemptions_total - (last.num_preemptions_total if last else 0))
        m.on_prefix_cache(stats.prefix_cache_queries_total - (last.prefix_cache_queries_total if last else 0),
                          stats.prefix_cache_hits_total - (last.prefix_cache_hits_total if last else 0))
        per_position = stats.spec_decode_accepted_per_position_total
        before = last.spec_decode_accepted_per_position_total if last else ()
        m.on_spec_decode(*(getattr(stats, name) - (getattr(last, name) if last else 0) for name in (
            "spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
            "spec_decode_num_accepted_tokens_total", "spec_decode_proposer_errors_total")),
            [n - (before[j] if j < len(before) else 0) for j, n in enumerate(per_position)])
        for gap in stats.inter_token_gaps:
            m.on_token_latency(gap)
        for tokens in stats.iteration_tokens:
            m.on_iteration_tokens(tokens)
        before_lora = dict(last.lora_requests_finished_total) if last else {}
        for name, total in stats.lora_requests_finished_total:
            m.on_lora_requests(name, total - before_lora.get(name, 0))
        self._record_lora_info(stats)

    def _record_lora_info(self, stats: EngineStats) -> None:
        """kvserve:lora_requests_info, as vLLM's: its value is when the adapters were last seen so;
        refreshed when they change, else at most once a second (a step takes milliseconds)."""
        if not self.max_loras:
            return
        info = (stats.lora_running, stats.lora_waiting)
        now = time.time()
        if info != self._lora_info or now - self._lora_info_at >= 1.0:
            self._lora_info, self._lora_info_at = info, now
            self.metrics.on_lora_info(info[0], info[1], self.max_loras, now)

    def _finished(self, out: RequestOutput, adapter: str | None) -> None:
        rm = out.metrics
        reason = "error" if out.error else (rm.finish_reasons[-1] if rm.finish_reasons else "abort")
        if self.metrics is not None:
            scheduled, first = rm.first_scheduled, rm.first_token
            queue_s = None if scheduled is None else scheduled - rm.arrival
            ttft_s = None if first is None else first - rm.arrival
            self.metrics.on_finished(reason, rm.finished - rm.arrival, queue_s, ttft_s)
            self.metrics.on_request_phases(
                rm.num_prompt_tokens, rm.num_generated_tokens,
                prefill_s=None if scheduled is None or first is None else first - scheduled,
                decode_s=None if first is None else rm.finished - first,
                inference_s=None if scheduled is None else rm.finished - scheduled)
            after_first = rm.max_choice_tokens - 1
            self.metrics.on_request_params(
                rm.n, rm.max_tokens, rm.max_choice_tokens,
                time_per_output_token_s=(rm.finished - first) / after_first if first is not None and after_first > 0
                else None)
        attributes = {sc.GEN_AI_REQUEST_MODEL: self.model_name, sc.GEN_AI_USAGE_INPUT_TOKENS: rm.num_prompt_tokens,
                      sc.GEN_AI_USAGE_OUTPUT_TOKENS: rm.num_generated_tokens,
                      sc.KVSERVE_CACHED_TOKENS: out.num_cached_tokens}
        if adapter is not None:
            attributes[sc.KVSERVE_LORA_NAME] = adapter
        record_request_spans(
            rm.traceparent, out.request_id,
            RequestTimeline(queued_ns=_ns(rm.arrival), finished_ns=_ns(rm.finished),
                            scheduled_ns=_ns(rm.first_scheduled), first_token_ns=_ns(rm.first_token),
                            preempted_ns=[_ns(t) for t in rm.preemptions]),
            attributes, finish_reason=reason, error=out.error)


def _string_parameter(request, name: str) -> str | None:
    value = request_parameter(request, name)
    return value[:128] if isinstance(value, str) and value else None


@dataclass(slots=True)
class RequestLog:
    """The log lines of one Triton request: "request queued" and "request finished".

    Both are bound (``request_context``) to the gateway's request id, else the
    engine's, and to the trace id of the request's traceparent. The prompt is
    in them only with --log-requests (``KVSERVE_LOG_REQUESTS``).
    """

    request_id: str
    engine_request_id: str
    traceparent: str | None

    @classmethod
    def for_request(cls, request, engine_request_id: str, traceparent: str | None) -> RequestLog:
        return cls(_string_parameter(request, X_REQUEST_ID_PARAM) or engine_request_id, engine_request_id,
                   traceparent)

    def context(self) -> AbstractContextManager[None]:
        return request_context(self.request_id, traceparent=self.traceparent,
                               engine_request_id=self.engine_request_id)

    def queued(self, prompt: str | list[int], params, stream: bool, tokenizer) -> None:
        try:
            self._queued(prompt, params, stream, tokenizer)
        except Exception:  # a log line must never fail the request
            request_log.exception("logging a queued request failed")

    def finished(self, out: RequestOutput) -> None:
        try:
            self._finished(out)
        except Exception:
            request_log.exception("logging a finished request failed")

    def _queued(self, prompt: str | list[int], params, stream: bool, tokenizer) -> None:
        fields = {"stream": stream, "n": params.n, "max_tokens": params.max_tokens}
        if params.grammar is not None:
            fields["structured_outputs"] = params.grammar.kind  # the kind only: a schema may be large
        if isinstance(prompt, list):
            fields["prompt_tokens"] = len(prompt)
        if log_requests_enabled():
            fields["prompt"] = prompt if isinstance(prompt, str) else tokenizer.decode(prompt, skip_special_tokens=False)
        with self.context():
            request_log.info("request queued", extra=fields)

    def _finished(self, out: RequestOutput) -> None:
        rm = out.metrics
        reasons = rm.finish_reasons if rm is not None else [c.finish_reason for c in out.outputs if c.finish_reason]
        fields: dict = {"finish_reason": "error" if out.error else ",".join(reasons) or "abort",
                        "prompt_tokens": len(out.prompt_token_ids), "cached_tokens": out.num_cached_tokens}
        if rm is not None:
            fields.update(completion_tokens=rm.num_generated_tokens, preemptions=len(rm.preemptions),
                          e2e_s=round(rm.finished - rm.arrival, 4))
            if rm.first_token is not None:
                fields["ttft_s"] = round(rm.first_token - rm.arrival, 4)
        if out.error:
            fields["error"] = out.error
        with self.context():
            request_log.log(logging.WARNING if out.error else logging.INFO, "request finished", extra=fields)
