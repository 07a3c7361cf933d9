"""The Prometheus metric catalogue of DESIGN.md, declared once as data.

Two adapters read it: ``BackendMetrics`` declares the backend metrics through
Triton's ``pb_utils.MetricFamily`` (so tritonserver, or the embedded host,
exports them on its metrics port) and ``GatewayMetrics`` (metrics_gateway.py)
puts the gateway metrics on a ``prometheus_client`` registry.

Naming: the ``kvserve:`` prefix with a colon, as vLLM uses ``vllm:``.
tritonserver accepts colons in custom metric names (its own vllm_backend
declares ``vllm:prompt_tokens_total`` through ``pb_utils.MetricFamily``), so the
same names appear on tritonserver, on the embedded host and on the gateway.
Fallback, should a Triton build ever reject a name: ``BackendMetrics`` retries
that family with ``:`` replaced by ``_`` (``kvserve_prompt_tokens_total``) and
logs a warning; ``BackendMetrics.names`` tells which name was used.
Counter names carry their ``_total`` suffix here: Triton exports names
verbatim, and prometheus_client renders ``X_total`` for a counter named so.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


class MetricKind(enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: MetricKind
    description: str
    labels: tuple[str, ...] = ()  # besides the per-model labels an adapter adds
    buckets: tuple[float, ...] | None = None  # histograms only; +Inf is implicit

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"invalid metric name {self.name!r}")
        if (self.kind is MetricKind.HISTOGRAM) != (self.buckets is not None):
            raise ValueError(f"{self.name}: buckets are required for histograms and only for them")
        if self.buckets is not None and list(self.buckets) != sorted(set(self.buckets)):
            raise ValueError(f"{self.name}: buckets must be strictly increasing")

    @property
    def fallback_name(self) -> str:
        return self.name.replace(":", "_")


# Bucket boundaries as in vLLM v1 (vllm/v1/metrics/loggers.py), so dashboards
# and SLO queries built for vLLM give comparable quantiles on kvserve.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# A request's prompt or output length: vLLM's 1-2-5 series, here up to the longest prompt taken.
TOKEN_COUNT_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
                       20000.0, 50000.0, 100000.0, 200000.0, 500000.0, 1000000.0)
# A request's `n`, as vLLM buckets it.
REQUEST_N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)
# Tokens one engine step ran, as vLLM buckets them.
ITERATION_TOKEN_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
# Embedding passes: a lone request's one input up to max_num_seqs / max_num_batched_tokens.
BATCH_SIZE_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)
BATCH_TOKEN_BUCKETS = (16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0)
# Gateway requests: sub-ms errors up to multi-minute streams.
HTTP_DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                         10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

C, G, H = MetricKind.COUNTER, MetricKind.GAUGE, MetricKind.HISTOGRAM

# --- backend (engine) ---
NUM_REQUESTS_RUNNING = MetricSpec("kvserve:num_requests_running", G, "Number of requests in the running batch.")
NUM_REQUESTS_WAITING = MetricSpec("kvserve:num_requests_waiting", G, "Number of requests waiting to be scheduled.")
NUM_GRAMMAR_MATCHERS = MetricSpec("kvserve:num_grammar_matchers", G,
                                  "Live structured-output grammar matchers (one per constrained sequence).")
KV_CACHE_USAGE_PERC = MetricSpec("kvserve:kv_cache_usage_perc", G, "KV-cache block usage; 1 means 100 percent.")
KV_CACHE_TOUCHED_BYTES = MetricSpec(
    "kvserve:kv_cache_touched_bytes", G,
    "Bytes of this process's KV cache in blocks used at least once; on the CPU, an upper bound of its resident memory.")
PROMPT_TOKENS = MetricSpec("kvserve:prompt_tokens_total", C,
                           "Number of prefill tokens processed: each request's prompt once its prefill is done.")
GENERATION_TOKENS = MetricSpec("kvserve:generation_tokens_total", C, "Number of generation tokens produced.")
REQUEST_SUCCESS = MetricSpec("kvserve:request_success_total", C, "Number of finished requests, by finish reason.",
                             labels=("finished_reason",))
NUM_PREEMPTIONS = MetricSpec("kvserve:num_preemptions_total", C, "Number of request preemptions (recompute).")
PREFIX_CACHE_QUERIES = MetricSpec("kvserve:prefix_cache_queries_total", C,
                                  "Prompt tokens looked up in the prefix cache.")
PREFIX_CACHE_HITS = MetricSpec("kvserve:prefix_cache_hits_total", C, "Prompt tokens found in the prefix cache.")
# Speculative decoding (issue 32), vLLM's spec_decode counters: a draft is one request's proposals
# in one step; acceptance rate = accepted / draft tokens.
SPEC_DECODE_NUM_DRAFTS = MetricSpec("kvserve:spec_decode_num_drafts_total", C,
                                    "Speculative drafts verified (one request's proposals in one step).")
SPEC_DECODE_NUM_DRAFT_TOKENS = MetricSpec("kvserve:spec_decode_num_draft_tokens_total", C,
                                          "Speculative tokens proposed and verified.")
SPEC_DECODE_NUM_ACCEPTED_TOKENS = MetricSpec("kvserve:spec_decode_num_accepted_tokens_total", C,
                                             "Speculative tokens the target model accepted.")
SPEC_DECODE_ACCEPTED_PER_POSITION = MetricSpec(
    "kvserve:spec_decode_num_accepted_tokens_per_pos_total", C,
    "Speculative tokens accepted at each proposal position (0: the first proposal of a draft).",
    labels=("position",))
SPEC_DECODE_PROPOSER_ERRORS = MetricSpec("kvserve:spec_decode_proposer_errors_total", C,
                                         "Steps whose proposer failed; they decoded without proposals.")
# LoRA (issue 33): vLLM's vllm:lora_requests_info, a gauge whose value is the time (Unix seconds)
# the adapters named in its labels were last seen running / waiting (comma-separated names).
LORA_REQUESTS_INFO = MetricSpec("kvserve:lora_requests_info", G,
                                "Running and waiting LoRA adapters; value: when last updated (Unix time).",
                                labels=("running_lora_adapters", "waiting_lora_adapters", "max_lora"))
LORA_REQUESTS = MetricSpec("kvserve:lora_requests_total", C, "Requests that ran with each LoRA adapter and ended.",
                           labels=("lora_name",))
TIME_TO_FIRST_TOKEN = MetricSpec("kvserve:time_to_first_token_seconds", H,
                                 "Time from arrival at the backend to the first token, in seconds.",
                                 buckets=TTFT_BUCKETS)
INTER_TOKEN_LATENCY = MetricSpec("kvserve:inter_token_latency_seconds", H,
                                 "Time between consecutive output tokens, in seconds.", buckets=ITL_BUCKETS)
E2E_REQUEST_LATENCY = MetricSpec("kvserve:e2e_request_latency_seconds", H,
                                 "Time from arrival at the backend to finish, in seconds.",
                                 buckets=REQUEST_LATENCY_BUCKETS)
REQUEST_QUEUE_TIME = MetricSpec("kvserve:request_queue_time_seconds", H,
                                "Time spent waiting before first scheduled, in seconds.",
                                buckets=REQUEST_LATENCY_BUCKETS)
# vLLM's per-request phases and sizes (its Grafana dashboard's "Request Prompt Length",
# "Requests Prefill and Decode Time"...): prefill runs from first scheduled to the first token,
# decode from the first token to the finish, inference from first scheduled to the finish.
REQUEST_PREFILL_TIME = MetricSpec("kvserve:request_prefill_time_seconds", H,
                                  "Time from first scheduled to the first token, in seconds.",
                                  buckets=REQUEST_LATENCY_BUCKETS)
REQUEST_DECODE_TIME = MetricSpec("kvserve:request_decode_time_seconds", H,
                                 "Time from the first token to the finish, in seconds.",
                                 buckets=REQUEST_LATENCY_BUCKETS)
REQUEST_INFERENCE_TIME = MetricSpec("kvserve:request_inference_time_seconds", H,
                                    "Time from first scheduled to the finish, in seconds.",
                                    buckets=REQUEST_LATENCY_BUCKETS)
REQUEST_PROMPT_TOKENS = MetricSpec("kvserve:request_prompt_tokens", H, "Prompt tokens of each finished request.",
                                   buckets=TOKEN_COUNT_BUCKETS)
REQUEST_GENERATION_TOKENS = MetricSpec("kvserve:request_generation_tokens", H,
                                       "Tokens generated by each finished request (all its choices).",
                                       buckets=TOKEN_COUNT_BUCKETS)
# vLLM's request parameters and per-request decode speed: `n`, `max_tokens` (the engine's, when the
# client set none), the longest choice's tokens, and decode time over that choice's tokens after the first.
REQUEST_PARAMS_N = MetricSpec("kvserve:request_params_n", H, "The n (choices) of each finished request.",
                              buckets=REQUEST_N_BUCKETS)
REQUEST_PARAMS_MAX_TOKENS = MetricSpec("kvserve:request_params_max_tokens", H,
                                       "The max_tokens of each finished request.", buckets=TOKEN_COUNT_BUCKETS)
REQUEST_MAX_NUM_GENERATION_TOKENS = MetricSpec("kvserve:request_max_num_generation_tokens", H,
                                               "Tokens of the longest choice of each finished request.",
                                               buckets=TOKEN_COUNT_BUCKETS)
REQUEST_TIME_PER_OUTPUT_TOKEN = MetricSpec("kvserve:request_time_per_output_token_seconds", H,
                                           "Each request's mean time per output token after its first, in seconds.",
                                           buckets=ITL_BUCKETS)
# vLLM's cache_config_info: a gauge at 1 whose labels say how the KV cache is set up.
CACHE_CONFIG_INFO = MetricSpec("kvserve:cache_config_info", G, "The KV cache's configuration, in its labels.",
                               labels=("block_size", "cache_dtype", "enable_prefix_caching", "num_gpu_blocks"))
# vLLM's name, a histogram despite its suffix: how full the steps are (decode-only steps of a batch of
# B run B tokens, B (1 + k) with k proposals each; a prompt chunk adds its length).
ITERATION_TOKENS = MetricSpec("kvserve:iteration_tokens_total", H, "Tokens run in each engine step.",
                              buckets=ITERATION_TOKEN_BUCKETS)

# --- the embed model (beside the catalogue; backend/embed/embed_telemetry.py) ---
EMBEDDING_BATCH_SIZE = MetricSpec("kvserve:embedding_batch_size", H,
                                  "Inputs packed into one embedding forward pass.", buckets=BATCH_SIZE_BUCKETS)
EMBEDDING_BATCH_TOKENS = MetricSpec("kvserve:embedding_batch_tokens", H,
                                    "Tokens in one embedding forward pass.", buckets=BATCH_TOKEN_BUCKETS)

# --- gateway (HTTP) ---
HTTP_REQUESTS = MetricSpec("kvserve:http_requests_total", C, "HTTP requests handled, by route and status.",
                           labels=("route", "status"))
HTTP_REQUEST_DURATION = MetricSpec("kvserve:http_request_duration_seconds", H,
                                   "HTTP request duration including the whole stream, in seconds.",
                                   labels=("route",), buckets=HTTP_DURATION_BUCKETS)
HTTP_STREAMS_IN_FLIGHT = MetricSpec(
    "kvserve:http_streams_in_flight", G,
    "SSE responses currently open; a streamed request opens its response with its first token "
    "(until then it waits in the engine's queue: see num_requests_waiting).")

# --- gateway router (only when it balances several replicas; frontend/backend_client/replicas/replica_set.py) ---
ROUTER_REQUESTS = MetricSpec("kvserve:router_requests_total", C,
                             "Backend requests routed, by replica and decision (affinity, least_loaded, retry).",
                             labels=("replica", "decision"))
ROUTER_OUTSTANDING = MetricSpec("kvserve:router_outstanding_requests", G,
                                "Requests this gateway has in flight on each replica.", labels=("replica",))
ROUTER_REPLICA_READY = MetricSpec("kvserve:router_replica_ready", G,
                                  "1 while the replica passes its health check and takes requests, else 0.",
                                  labels=("replica",))

del C, G, H

BACKEND_METRICS: tuple[MetricSpec, ...] = (
    NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING, KV_CACHE_USAGE_PERC, KV_CACHE_TOUCHED_BYTES, PROMPT_TOKENS,
    GENERATION_TOKENS, REQUEST_SUCCESS, NUM_PREEMPTIONS, PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS, TIME_TO_FIRST_TOKEN,
    INTER_TOKEN_LATENCY, E2E_REQUEST_LATENCY, REQUEST_QUEUE_TIME, REQUEST_PREFILL_TIME, REQUEST_DECODE_TIME,
    REQUEST_INFERENCE_TIME, REQUEST_PROMPT_TOKENS, REQUEST_GENERATION_TOKENS, ITERATION_TOKENS, NUM_GRAMMAR_MATCHERS,
    SPEC_DECODE_NUM_DRAFTS, SPEC_DECODE_NUM_DRAFT_TOKENS, SPEC_DECODE_NUM_ACCEPTED_TOKENS,
    SPEC_DECODE_ACCEPTED_PER_POSITION, SPEC_DECODE_PROPOSER_ERRORS, LORA_REQUESTS_INFO, LORA_REQUESTS,
    REQUEST_PARAMS_N, REQUEST_PARAMS_MAX_TOKENS, REQUEST_MAX_NUM_GENERATION_TOKENS, REQUEST_TIME_PER_OUTPUT_TOKEN,
    CACHE_CONFIG_INFO,
)
GATEWAY_METRICS: tuple[MetricSpec, ...] = (HTTP_REQUESTS, HTTP_REQUEST_DURATION, HTTP_STREAMS_IN_FLIGHT)
CATALOGUE: tuple[MetricSpec, ...] = BACKEND_METRICS + GATEWAY_METRICS
# Declared by the embed model: what an embedding request moves (no KV cache, no decoding).
EMBED_METRICS: tuple[MetricSpec, ...] = (
    PROMPT_TOKENS, REQUEST_SUCCESS, E2E_REQUEST_LATENCY, REQUEST_QUEUE_TIME, EMBEDDING_BATCH_SIZE,
    EMBEDDING_BATCH_TOKENS,
)
# Declared by the router beside the catalogue: DESIGN.md's catalogue is the one-backend set.
ROUTER_METRICS: tuple[MetricSpec, ...] = (ROUTER_REQUESTS, ROUTER_OUTSTANDING, ROUTER_REPLICA_READY)
SPECS_BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in CATALOGUE}

# Pre-created so each series exists at 0 and rate() works from the first scrape.
FINISHED_REASONS = ("stop", "length", "abort", "error")
