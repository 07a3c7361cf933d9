"""The engine's tokenizer: the seam's `ModelTokenizer` (the gateway reads the same one), from a
model folder or from the tokenizer a GGUF file carries in its metadata (gguf_tokenizer.py)."""
from __future__ import annotations

from pathlib import Path

from kvserve.seam.tokenizer import ModelTokenizer


def load_engine_tokenizer(model_path: str | Path) -> ModelTokenizer:
    from kvserve.backend.models import gguf_file, open_gguf
    gguf = gguf_file(model_path)
    if gguf is not None:
        from kvserve.backend.models import build_tokenizer
        return build_tokenizer(open_gguf(gguf))
    try:
        return ModelTokenizer.from_folder(model_path)
    except FileNotFoundError:
        raise ValueError(f"model: no tokenizer.json in {model_path}") from None
