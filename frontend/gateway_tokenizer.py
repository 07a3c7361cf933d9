"""The gateway's view of the model's tokenizer: encode/decode for chat prompts
and the /tokenize routes, plus the special tokens and chat template the
Hugging Face files declare. Reads only local files (no hub access).
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

# Longer texts are tokenized on a worker thread (as the engine's tokenizer does without the GIL).
LONG_TEXT_CHARS = 16_384


@dataclass(slots=True)
class GatewayTokenizer:
    tokenizer: Tokenizer
    bos_token: str | None
    eos_token: str | None
    chat_template: str | None
    add_bos_token: bool
    source: str
    # Each token's text, as logprobs show it: filled as tokens are seen, at most the vocabulary.
    _texts: dict[int, str] = field(default_factory=dict, init=False, repr=False)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        # Rendered chat prompts already hold their special tokens as text; the
        # tokenizer's post-processor must not add a second BOS to them.
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    async def encode_async(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """encode() for request handlers: a long text (a megabyte takes ~1 s) is tokenized on a
        worker thread, without the GIL, so the event loop keeps serving every other stream."""
        if len(text) <= LONG_TEXT_CHARS:
            return self.encode(text, add_special_tokens=add_special_tokens)
        batch = await asyncio.to_thread(self.tokenizer.encode_batch, [text], add_special_tokens=add_special_tokens)
        return batch[0].ids

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token decoded alone, special tokens included (a lone byte of a
        multi-byte character reads as U+FFFD), as the logprobs of OpenAI's API show it."""
        text = self._texts.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False) if token_id < self.vocab_size else ""
            self._texts[token_id] = text
        return text

    def token_strings(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.id_to_token(i) or "" for i in ids]


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json writes special tokens either as a string or as an
    # AddedToken dict {"content": ...}.
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _template_from_config(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default") or next((t for t in named.values() if isinstance(t, str)), None)
    return None


def load_tokenizer(model_dir: str | Path) -> GatewayTokenizer:
    path = Path(model_dir)
    tokenizer_file = path / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise FileNotFoundError(f"{tokenizer_file} not found (the gateway needs the model's tokenizer.json)")
    config: dict[str, Any] = {}
    config_file = path / "tokenizer_config.json"
    if config_file.is_file():
        config = json.loads(config_file.read_text(encoding="utf-8"))
    template = _template_from_config(config.get("chat_template"))
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():  # newer HF layout keeps the template in its own file
        template = jinja_file.read_text(encoding="utf-8")
    return GatewayTokenizer(
        tokenizer=Tokenizer.from_file(str(tokenizer_file)),
        bos_token=_token_text(config.get("bos_token")),
        eos_token=_token_text(config.get("eos_token")),
        chat_template=template,
        add_bos_token=bool(config.get("add_bos_token", False)),
        source=str(path),
    )
