"""Names of the embed model's tensors (model_repository/embed/config.pbtxt declares them).

One request carries every input of one /v1/embeddings call; its one response
(FINAL) carries all their vectors.
"""
from __future__ import annotations

# ---- inputs: texts, or token ids with each input's length ---------------------------------------
TEXT_INPUT = "text_input"                    # BYTES [n]: one UTF-8 text per input, or
INPUT_IDS = "input_ids"                      # INT32 [total]: every input's ids, concatenated, with
INPUT_LENGTHS = "input_lengths"              # INT32 [n]: the length of each input
POOLING_PARAMETERS = "pooling_parameters"    # BYTES [1]: JSON object, keys in POOLING_FIELDS

# ---- outputs ------------------------------------------------------------------------------------
EMBEDDING = "embedding"                      # FP32 [n, dim]
PROMPT_TOKENS = "prompt_tokens"              # INT32 [n]: tokens of each input as the model ran it

INPUTS = (TEXT_INPUT, INPUT_IDS, INPUT_LENGTHS, POOLING_PARAMETERS)
OUTPUTS = (EMBEDDING, PROMPT_TOKENS)

# The keys of `pooling_parameters` (vLLM's PoolingParams names, plus OpenAI's `dimensions`).
POOLING_FIELDS = frozenset({"truncate_prompt_tokens", "normalize", "dimensions"})
# Error params that name what the client sent as `input`.
INPUT_PARAMS = frozenset({TEXT_INPUT, INPUT_IDS, INPUT_LENGTHS, "input"})
