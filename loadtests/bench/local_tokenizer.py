"""`kvserve bench --tokenizer`: count prompt tokens with a local tokenizer
instead of the server's /tokenize, as `vllm bench serve --tokenizer` does.

This is what makes one workload the same for different servers: with the same
tokenizer, dataset and seed, every server gets the very same prompt texts,
whether or not it has a vLLM-style /tokenize (llama.cpp's takes other fields).
Completions only: the prompt is tokenized as the server will, special tokens
included; a chat template would need the server's own rendering.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer


@dataclass(frozen=True, slots=True)
class LocalTokenCounter:
    tokenizer: Tokenizer

    async def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=True).ids)


def load_counter(path: str) -> LocalTokenCounter:
    """A Hugging Face model folder (its tokenizer.json) or a tokenizer.json file."""
    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise ValueError(f"--tokenizer {path}: no tokenizer.json there (give a Hugging Face folder or the file)")
    try:
        return LocalTokenCounter(Tokenizer.from_file(str(file)))
    except Exception as exc:  # tokenizers raises its own Exception subclass on a malformed file
        raise ValueError(f"--tokenizer {path}: cannot load {file}: {exc}") from exc
