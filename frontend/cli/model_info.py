"""What the gateway can learn from a local model folder without the engine.

`max_model_len` is derived exactly as the engine derives it when no
--max-model-len is given (the model's `max_position_embeddings`, capped by a
sliding window, or for an embedding model by sentence-transformers'
`max_seq_length`), so that chat requests without `max_tokens` can default to
"up to the context limit" as in vLLM, and /v1/models can report it.
"""
from __future__ import annotations

import json
from pathlib import Path


def derive_max_model_len(model_dir: Path | None, flag: int | None) -> int | None:
    if flag is not None:
        return flag
    if model_dir is None:
        return None
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    limit = config.get("max_position_embeddings")
    if not isinstance(limit, int) or limit <= 0:
        return None
    # Same rule as the engine's arch config: Mistral uses its window unless told
    # otherwise, Qwen-style configs only with use_sliding_window: true.
    archs = config.get("architectures") or [""]
    uses_window = config.get("use_sliding_window", archs[0] == "MistralForCausalLM")
    window = config.get("sliding_window")
    if uses_window and isinstance(window, int) and 0 < window < limit:
        limit = window
    # An embedding model's own limit, as the embed model takes it (backend/embed/embedder.py).
    try:
        seq = json.loads((model_dir / "sentence_bert_config.json").read_text(encoding="utf-8")).get("max_seq_length")
    except (OSError, ValueError, AttributeError):
        seq = None
    if isinstance(seq, int) and not isinstance(seq, bool) and 2 <= seq < limit:
        limit = seq
    return limit
