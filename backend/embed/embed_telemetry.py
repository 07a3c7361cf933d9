"""The embed model's metrics, spans and request log lines, fed by the batcher.

Per pass: the batch-size and batch-token histograms (how well concurrent
requests were packed together). Per request, once its last input ran: the
prompt token counter, request_success{finished_reason="stop"}, the e2e and
queue histograms, a span with gen_ai.operation.name "embeddings" under the
gateway's, and one "request finished" line.
"""
from __future__ import annotations

import logging

from kvserve.backend.embed.embed_batcher import EmbedJob, EmbedResult
from kvserve.observability import semconv as sc
from kvserve.observability.logging import request_context
from kvserve.observability.request_spans import RequestTimeline, record_request_spans

request_log = logging.getLogger("kvserve.backend.requests")
batch_log = logging.getLogger("kvserve.backend.embed")


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1e9)


class EmbedTelemetry:
    def __init__(self, metrics, model_name: str, log_ids: dict[str, str] | None = None) -> None:
        self.metrics = metrics  # BackendMetrics or None
        self.model_name = model_name
        self.log_ids = log_ids if log_ids is not None else {}  # engine request id -> gateway request id

    def on_batch(self, num_inputs: int, num_tokens: int, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.on_embedding_batch(num_inputs, num_tokens)
        batch_log.debug("embedding pass", extra={"batch_inputs": num_inputs, "batch_tokens": num_tokens,
                                                 "pass_s": round(seconds, 4)})

    def on_finished(self, job: EmbedJob, result: EmbedResult) -> None:
        tokens = sum(result.prompt_tokens)
        reason = "error" if result.error else "stop"
        if self.metrics is not None:
            if result.error is None:
                self.metrics.on_prompt_tokens(tokens)
            queue_s = None if result.scheduled is None else result.scheduled - result.arrival
            self.metrics.on_finished(reason, result.finished - result.arrival, queue_s)
        record_request_spans(
            job.traceparent, result.request_id,
            RequestTimeline(queued_ns=_ns(result.arrival), finished_ns=_ns(result.finished),
                            scheduled_ns=_ns(result.scheduled)),
            {sc.GEN_AI_OPERATION_NAME: sc.OPERATION_EMBEDDINGS, sc.GEN_AI_REQUEST_MODEL: self.model_name,
             sc.GEN_AI_USAGE_INPUT_TOKENS: tokens, sc.KVSERVE_EMBEDDING_INPUTS: len(result.prompt_tokens),
             sc.KVSERVE_EMBEDDING_PASSES: result.num_passes},
            finish_reason=reason, error=result.error)
        fields = {"finish_reason": reason, "inputs": len(result.prompt_tokens), "prompt_tokens": tokens,
                  "passes": result.num_passes, "e2e_s": round(result.finished - result.arrival, 4)}
        if result.error:
            fields["error"] = result.error
        rid = self.log_ids.pop(result.request_id, result.request_id)
        try:
            with request_context(rid, traceparent=job.traceparent, engine_request_id=result.request_id):
                request_log.log(logging.WARNING if result.error else logging.INFO, "request finished", extra=fields)
        except Exception:  # a log line must never fail the request
            request_log.exception("logging a finished embedding request failed")
