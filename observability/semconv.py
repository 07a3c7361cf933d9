"""Span attribute names: OpenTelemetry ``gen_ai.*`` semantic conventions.

Declared here as plain strings rather than imported from
``opentelemetry.semconv._incubating`` because that module is private and its
names move between releases; a renamed attribute would silently break
dashboards. The latency names are not in the conventions yet: they are the
ones vLLM emits (``vllm/tracing.py``), so a Jaeger/Tempo query written for
vLLM works on kvserve unchanged. All latencies are in seconds (float).
"""

from __future__ import annotations

# --- standard gen_ai.* (https://opentelemetry.io/docs/specs/semconv/gen-ai/) ---
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"  # "chat" | "text_completion" | "embeddings"
GEN_AI_SYSTEM = "gen_ai.system"  # always GEN_AI_SYSTEM_VALUE for kvserve
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"  # successor of gen_ai.system
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"  # list[str]
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"

# --- not (yet) in the conventions; same names as vLLM ---
GEN_AI_REQUEST_ID = "gen_ai.request.id"
GEN_AI_REQUEST_N = "gen_ai.request.n"
GEN_AI_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e"
GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill"
GEN_AI_LATENCY_TIME_IN_MODEL_DECODE = "gen_ai.latency.time_in_model_decode"
GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE = "gen_ai.latency.time_in_model_inference"

# --- kvserve-specific ---
KVSERVE_NUM_PREEMPTIONS = "kvserve.num_preemptions"
KVSERVE_CACHED_TOKENS = "kvserve.prefix_cache.hit_tokens"
KVSERVE_LORA_NAME = "kvserve.lora.name"  # the LoRA adapter a request ran with (absent: the base model)
KVSERVE_EMBEDDING_INPUTS = "kvserve.embedding.inputs"  # inputs (texts) in one embeddings request
KVSERVE_EMBEDDING_PASSES = "kvserve.embedding.passes"  # forward passes its inputs ran in

GEN_AI_SYSTEM_VALUE = "kvserve"
OPERATION_CHAT = "chat"
OPERATION_TEXT_COMPLETION = "text_completion"
OPERATION_EMBEDDINGS = "embeddings"

__all__ = [name for name in dir() if name.isupper()]
