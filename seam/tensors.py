"""Names of the llm model's tensors and request parameters (config.pbtxt declares them).

One response per choice per engine step, deltas only; the last response of a
request carries Triton's FINAL flag. Token ids and logprobs cross as numbers:
the gateway, which has the tokenizer, renders their text.
"""
from __future__ import annotations

# ---- inputs ----------------------------------------------------------------------------------
TEXT_INPUT = "text_input"                    # BYTES [1]: the prompt as UTF-8 text, or
INPUT_IDS = "input_ids"                      # INT32 [-1]: the prompt as token ids
SAMPLING_PARAMETERS = "sampling_parameters"  # BYTES [1]: JSON object, keys in SAMPLING_FIELDS
STREAM = "stream"                            # BOOL [1]: deltas as they come (default) or one response

# ---- outputs (one response = one choice's delta) ----------------------------------------------
TEXT_OUTPUT = "text_output"                  # BYTES: the new text
OUTPUT_IDS = "output_ids"                    # INT32: the new token ids
FINISH_REASON = "finish_reason"              # BYTES: "" while running, then stop/length/abort/error
INDEX = "index"                              # INT32: the choice, 0..n-1
PROMPT_TOKENS = "prompt_tokens"              # INT32 [1]
COMPLETION_TOKENS = "completion_tokens"      # INT32: cumulative for this choice
CACHED_TOKENS = "cached_tokens"              # INT32 [1]: prompt tokens found in the prefix cache
# Logprobs, only when asked for: one row per new token, k = the request's `logprobs`.
LOGPROB_IDS = "logprob_ids"                  # INT32 [tokens, 1 + k]: the sampled token, then the top k
LOGPROB_VALUES = "logprob_values"            # FP32  [tokens, 1 + k]: their logprobs
# Prompt logprobs (`prompt_logprobs` = k), once, on the request's first response after its prompt
# ran: one row per prompt token, the token then the top k there given the tokens before it.
# Row 0 has no logprob (NaN, and top ids -1): nothing comes before the first token.
PROMPT_LOGPROB_IDS = "prompt_logprob_ids"    # INT32 [prompt tokens, 1 + k]
PROMPT_LOGPROB_VALUES = "prompt_logprob_values"  # FP32 [prompt tokens, 1 + k]
PROMPT_LOGPROB_RANKS = "prompt_logprob_ranks"    # INT32 [prompt tokens]: each token's vocabulary rank (row 0: 0)

INPUTS = (TEXT_INPUT, INPUT_IDS, SAMPLING_PARAMETERS, STREAM)
OUTPUTS = (TEXT_OUTPUT, OUTPUT_IDS, FINISH_REASON, INDEX, PROMPT_TOKENS, COMPLETION_TOKENS, CACHED_TOKENS,
           LOGPROB_IDS, LOGPROB_VALUES, PROMPT_LOGPROB_IDS, PROMPT_LOGPROB_VALUES,
           PROMPT_LOGPROB_RANKS)

# ---- request parameters (ModelInferRequest.parameters) -----------------------------------------
TRACEPARENT_PARAM = "traceparent"            # W3C trace context of the gateway's client span
# A request with this parameter true (and no inputs) asks the model what it serves: one FINAL
# response whose TEXT_OUTPUT is a JSON object with the MODEL_FACTS keys. A gateway in front of
# tritonserver learns the context length and the served name this way: neither ModelMetadata nor
# ModelConfig can carry them (a Python backend's auto-complete cannot add parameters).
DESCRIBE_PARAM = "kvserve_describe"
MODEL_FACTS = ("max_model_len", "served_model_name", "enable_lora")

# ---- LoRA adapters (docs/lora.md) --------------------------------------------------------------
# A generate request with this string parameter runs with that adapter (absent: the base model).
# The model resolves the name; an unknown one ends the request with ErrorKind.NOT_FOUND.
LORA_NAME_PARAM = "lora_name"
# A request with this string parameter (and no inputs) manages the adapters: its value is a JSON
# object {"action": one of LORA_ACTIONS, "lora_name": ..., "lora_path": ...} (name and path as the
# action needs). One FINAL response whose TEXT_OUTPUT is JSON {"adapters": [{LORA_ADAPTER_KEYS}]},
# the adapters served after the action; or an error (NOT_FOUND: unknown name; INVALID: bad files,
# a name already loaded, runtime updates not allowed).
LORA_CONTROL_PARAM = "kvserve_lora"
LORA_ACTIONS = ("list", "load", "unload")
LORA_ADAPTER_KEYS = ("name", "path", "parent")  # parent: --lora-modules base_model_name, or null

# ---- Engine control ------------------------------------------------------------------------------
# A request with this string parameter (and no inputs) acts on the engine: its value is one of
# ENGINE_ACTIONS. One FINAL response whose TEXT_OUTPUT is JSON {"action": ..., "forgotten_blocks":
# N} (reset_prefix_cache: the cached blocks the engine forgot); or an error (INVALID: unknown action).
ENGINE_CONTROL_PARAM = "kvserve_engine"
ENGINE_ACTIONS = ("reset_prefix_cache",)

# The keys of `sampling_parameters`: SamplingParams' init fields (tests/contract checks both ways).
SAMPLING_FIELDS = frozenset({
    "n", "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "seed", "stop", "stop_token_ids", "include_stop_str_in_output",
    "ignore_eos", "logprobs", "prompt_logprobs", "logit_bias", "allowed_token_ids", "bad_words",
    "truncate_prompt_tokens", "skip_special_tokens", "cache_salt", "timeout", "priority", "structured_outputs",
    "prediction",
})
