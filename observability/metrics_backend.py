"""Backend metrics through Triton's ``pb_utils.MetricFamily``.

The engine calls typed methods (``on_step``, ``on_finished`` ...) and never
sees a metric name. ``pb_utils`` is passed in, not imported: inside
tritonserver it is ``triton_python_backend_utils``, under the embedded host
the host's module of the same name, in tests a fake.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any

from . import metrics_catalogue as m

_log = logging.getLogger(__name__)


class BackendMetrics:
    """Thread-safe recorder for the engine's metrics.

    model_labels (e.g. ``{"model": "llm", "version": "1"}``) go on every
    series. Counters reject negative increments with ValueError (a counter
    that goes down is a bug upstream); zero increments are skipped.
    Construct it in ``TritonPythonModel.initialize()``, as Triton's own
    vllm_backend does, once per model instance.
    """

    def __init__(self, pb_utils: ModuleType | Any, model_labels: Mapping[str, str] | None = None,
                 specs: Iterable[m.MetricSpec] = m.BACKEND_METRICS) -> None:
        self._pb = pb_utils
        self._model_labels = {str(k): str(v) for k, v in (model_labels or {}).items()}
        self._lock = threading.Lock()
        self._families: dict[str, Any] = {}
        self._series: dict[tuple[str, tuple[str, ...]], Any] = {}
        self.names: dict[str, str] = {}  # catalogue name -> name exported by Triton
        for spec in specs:
            self._families[spec.name] = self._declare(spec)
            if not spec.labels:
                self._get(spec)
        for reason in m.FINISHED_REASONS:
            if m.REQUEST_SUCCESS.name in self._families:
                self._get(m.REQUEST_SUCCESS, reason)

    def _declare(self, spec: m.MetricSpec) -> Any:
        kind = getattr(self._pb.MetricFamily, spec.kind.name)
        try:
            family = self._pb.MetricFamily(name=spec.name, description=spec.description, kind=kind)
            self.names[spec.name] = spec.name
        except Exception as exc:  # Triton raises TritonModelException; keep serving
            _log.warning("metric name %s rejected (%s); using %s", spec.name, exc, spec.fallback_name)
            family = self._pb.MetricFamily(name=spec.fallback_name, description=spec.description, kind=kind)
            self.names[spec.name] = spec.fallback_name
        return family

    def _get(self, spec: m.MetricSpec, *label_values: str) -> Any:
        """The series of spec for label_values, created on first use (caller may hold the lock)."""
        key = (spec.name, label_values)
        series = self._series.get(key)
        if series is None:
            labels = dict(self._model_labels)
            labels.update(zip(spec.labels, label_values))
            family = self._families[spec.name]
            if spec.buckets is not None:
                series = family.Metric(labels=labels, buckets=list(spec.buckets))
            else:
                series = family.Metric(labels=labels)
            self._series[key] = series
        return series

    def _inc(self, spec: m.MetricSpec, n: float, *label_values: str) -> None:
        if n < 0:
            raise ValueError(f"{spec.name}: negative increment {n}")
        if n:
            with self._lock:
                self._get(spec, *label_values).increment(n)

    def _observe(self, spec: m.MetricSpec, value: float | None) -> None:
        if value is not None:
            with self._lock:
                self._get(spec).observe(max(0.0, float(value)))

    # --- the engine's API ---

    def on_step(self, running: int, waiting: int, kv_usage: float, grammar_matchers: int = 0,
                kv_touched_bytes: int = 0) -> None:
        """Scheduler state after a step; kv_usage is a fraction in [0, 1]."""
        with self._lock:
            self._get(m.NUM_REQUESTS_RUNNING).set(running)
            self._get(m.NUM_REQUESTS_WAITING).set(waiting)
            self._get(m.KV_CACHE_USAGE_PERC).set(kv_usage)
            self._get(m.KV_CACHE_TOUCHED_BYTES).set(kv_touched_bytes)
            if m.NUM_GRAMMAR_MATCHERS.name in self._families:
                self._get(m.NUM_GRAMMAR_MATCHERS).set(grammar_matchers)

    def on_prompt_tokens(self, n: int) -> None:
        self._inc(m.PROMPT_TOKENS, n)

    def on_generation_tokens(self, n: int) -> None:
        self._inc(m.GENERATION_TOKENS, n)

    def on_finished(self, reason: str, e2e_s: float, queue_s: float | None = None,
                    ttft_s: float | None = None) -> None:
        """A request left the engine; None for a phase it never reached."""
        self._inc(m.REQUEST_SUCCESS, 1, str(reason))
        self._observe(m.E2E_REQUEST_LATENCY, e2e_s)
        self._observe(m.REQUEST_QUEUE_TIME, queue_s)
        self._observe(m.TIME_TO_FIRST_TOKEN, ttft_s)

    def on_request_phases(self, prompt_tokens: int, generation_tokens: int, prefill_s: float | None,
                          decode_s: float | None, inference_s: float | None) -> None:
        """A finished generation request's sizes and phases (vLLM's); None for a phase it never reached."""
        self._observe(m.REQUEST_PROMPT_TOKENS, prompt_tokens)
        self._observe(m.REQUEST_GENERATION_TOKENS, generation_tokens)
        self._observe(m.REQUEST_PREFILL_TIME, prefill_s)
        self._observe(m.REQUEST_DECODE_TIME, decode_s)
        self._observe(m.REQUEST_INFERENCE_TIME, inference_s)

    def on_request_params(self, n: int, max_tokens: int | None, max_choice_tokens: int,
                          time_per_output_token_s: float | None) -> None:
        """A finished generation request's n and max_tokens, its longest choice's tokens, and its mean
        time per output token after the first (None with fewer than two tokens)."""
        self._observe(m.REQUEST_PARAMS_N, n)
        self._observe(m.REQUEST_PARAMS_MAX_TOKENS, max_tokens)
        self._observe(m.REQUEST_MAX_NUM_GENERATION_TOKENS, max_choice_tokens)
        self._observe(m.REQUEST_TIME_PER_OUTPUT_TOKEN, time_per_output_token_s)

    def on_cache_config(self, block_size: int, cache_dtype: str, enable_prefix_caching: bool, num_blocks: int) -> None:
        """Once, when the engine has started: its KV cache's set-up (vLLM's cache_config_info)."""
        if m.CACHE_CONFIG_INFO.name in self._families:
            with self._lock:
                self._get(m.CACHE_CONFIG_INFO, str(block_size), cache_dtype, str(enable_prefix_caching),
                          str(num_blocks)).set(1)

    def on_iteration_tokens(self, tokens: int) -> None:
        """The tokens one engine step ran."""
        self._observe(m.ITERATION_TOKENS, tokens)

    def on_token_latency(self, seconds: float) -> None:
        """Time between two consecutive output tokens of one request."""
        self._observe(m.INTER_TOKEN_LATENCY, seconds)

    def on_embedding_batch(self, num_inputs: int, num_tokens: int) -> None:
        """One embedding forward pass: how many inputs and tokens it packed."""
        self._observe(m.EMBEDDING_BATCH_SIZE, num_inputs)
        self._observe(m.EMBEDDING_BATCH_TOKENS, num_tokens)

    def on_preemptions(self, n: int) -> None:
        self._inc(m.NUM_PREEMPTIONS, n)

    def on_spec_decode(self, drafts: int, draft_tokens: int, accepted_tokens: int, proposer_errors: int,
                       accepted_per_position: Sequence[int] = ()) -> None:
        """Speculative decoding since the last step (all zero when it is off); accepted_per_position[j]:
        proposals accepted at position j of their draft."""
        if accepted_tokens > draft_tokens:
            raise ValueError(f"accepted speculative tokens ({accepted_tokens}) exceed drafted ({draft_tokens})")
        self._inc(m.SPEC_DECODE_NUM_DRAFTS, drafts)
        self._inc(m.SPEC_DECODE_NUM_DRAFT_TOKENS, draft_tokens)
        self._inc(m.SPEC_DECODE_NUM_ACCEPTED_TOKENS, accepted_tokens)
        self._inc(m.SPEC_DECODE_PROPOSER_ERRORS, proposer_errors)
        for position, n in enumerate(accepted_per_position):
            self._inc(m.SPEC_DECODE_ACCEPTED_PER_POSITION, n, str(position))

    def on_lora_info(self, running: Sequence[str], waiting: Sequence[str], max_lora: int, now: float) -> None:
        """The adapters with running and waiting requests (vLLM's lora_requests_info): the series
        of this combination is set to `now`, the time it was last seen."""
        if m.LORA_REQUESTS_INFO.name in self._families:
            with self._lock:
                self._get(m.LORA_REQUESTS_INFO, ",".join(running), ",".join(waiting), str(max_lora)).set(now)

    def on_lora_requests(self, lora_name: str, n: int) -> None:
        """Requests that ran with this adapter and ended (finished, aborted or failed)."""
        if m.LORA_REQUESTS.name in self._families:
            self._inc(m.LORA_REQUESTS, n, lora_name)

    def on_prefix_cache(self, queries: int, hits: int) -> None:
        """Prompt tokens looked up in / found in the prefix cache."""
        if hits > queries:
            raise ValueError(f"prefix cache hits ({hits}) exceed queries ({queries})")
        self._inc(m.PREFIX_CACHE_QUERIES, queries)
        self._inc(m.PREFIX_CACHE_HITS, hits)
