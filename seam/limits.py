"""Request limits the engine enforces and the gateway checks first (to answer in
the client's own field names before a round trip)."""
from __future__ import annotations

MAX_N = 16                 # choices per prompt
DEFAULT_MAX_TOKENS = 16    # max_tokens when a completion sets none (OpenAI's and vLLM's default)
MAX_LOGPROBS = 20          # top alternatives per token
MAX_STOP = 64              # stop strings, and stop token ids
MAX_STOP_CHARS = 256       # characters per stop string
MAX_LOGIT_BIAS = 1024      # entries of logit_bias
MAX_LOGIT_BIAS_VALUE = 100.0
MAX_ALLOWED_TOKEN_IDS = 1 << 18  # entries of allowed_token_ids (a vocabulary of 262k)
MAX_TIMEOUT_S = 86400.0    # a request's `timeout`, seconds from arrival
MAX_PROMPT_TOKENS = 1 << 20  # input_ids elements
# Every integer a client sets fits in an int64 (as in vLLM): beyond it a value cannot be a span
# attribute (the OTLP exporter fails the whole batch), a protobuf int64 or a torch seed.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_LORA_NAME_CHARS = 256  # a LoRA adapter's name (--lora-modules, load_lora_adapter, a request's model)
MAX_PREDICTION_CHARS = 1 << 16  # a chat's predicted output (OpenAI's `prediction`), in characters
MAX_EMBEDDING_INPUTS = 2048  # inputs of one /v1/embeddings request (OpenAI's limit); a model may allow fewer


def kept_prompt_tokens(num_tokens: int, truncate: int | None, max_tokens: int | None, max_model_len: int) -> int:
    """How many of a prompt's tokens vLLM's `truncate_prompt_tokens` keeps (its last ones): all
    when unset; -1 keeps as many as fit beside max_tokens (None: beside one token), where vLLM's
    -1, the model's whole length, would leave no room to generate."""
    if truncate is None:
        return num_tokens
    if truncate == -1:
        truncate = max(1, max_model_len - (max_tokens or 1))
    return min(num_tokens, truncate)
