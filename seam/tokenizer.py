"""The model's tokenizer, one wrapper for both sides of the seam: the engine encodes prompts and
decodes its outputs with it, the gateway renders chat prompts, answers /tokenize and turns the
token ids of logprobs into text with it. Both sides must read the same files the same way (the
same special tokens, the same long-text rule), so it is written once, here.

Uses the `tokenizers` library on tokenizer.json directly (fast, no transformers import), with
tokenizer_config.json, chat_template.jinja, generation_config.json and config.json for what
tokenizer.json does not carry. Reads only local files (no hub). A GGUF file's tokenizer is built
by the backend (models/gguf_tokenizer.py, which needs the `gguf` package) through the
constructor; the gateway reads the same one from the files that module exports.

Not imported by the rest of kvserve.seam, which stays standard-library only: this module alone
needs `tokenizers` (tests/contract/test_import_rules.py).
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models

from kvserve.seam.token_bytes import TokenBytes

# Longer texts are tokenized without holding the GIL (and, in the gateway, off the event loop).
LONG_TEXT_CHARS = 16_384


class ModelTokenizer:
    def __init__(self, tokenizer: Tokenizer, *, eos_token_ids: Iterable[int] = (), bos_token: str | None = None,
                 eos_token: str | None = None, chat_template: str | None = None, add_bos_token: bool = False) -> None:
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.chat_template = chat_template
        self.add_bos_token = add_bos_token
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        # Each token's text, as logprobs show it: filled as tokens are seen, at most the vocabulary.
        self._texts: dict[int, str] = {}
        self._bytes: dict[int, bytes] = {}
        self._token_bytes: TokenBytes | None = None
        self._max_chars_per_token: int | None | bool = False  # False: not computed yet

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelTokenizer:
        """A Hugging Face model (or tokenizer) folder; FileNotFoundError without tokenizer.json."""
        path = Path(folder)
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(f"{tokenizer_file} not found (the gateway and the engine read the model's tokenizer.json)")
        config = _read_json(path / "tokenizer_config.json")
        template = _template_from_config(config.get("chat_template"))
        jinja_file = path / "chat_template.jinja"
        if jinja_file.is_file():  # newer HF layout keeps the template in its own file
            template = jinja_file.read_text(encoding="utf-8")
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        eos: set[int] = set()
        for given in (_read_json(path / "generation_config.json").get("eos_token_id"),
                      _read_json(path / "config.json").get("eos_token_id")):
            if isinstance(given, int):
                eos.add(given)
            elif isinstance(given, list):
                eos.update(int(t) for t in given)
        eos_token = _token_text(config.get("eos_token"))
        if eos_token and tokenizer.token_to_id(eos_token) is not None:
            eos.add(tokenizer.token_to_id(eos_token))
        return cls(tokenizer, eos_token_ids=eos, bos_token=_token_text(config.get("bos_token")), eos_token=eos_token,
                   chat_template=template, add_bos_token=bool(config.get("add_bos_token", False)))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # Rendered chat prompts already hold their special tokens as text: the gateway passes
        # add_special_tokens=False so the post-processor does not add a second BOS.
        if len(text) > LONG_TEXT_CHARS:
            # `tokenizers` holds the GIL through encode() but not through encode_batch(): a
            # megabyte of text takes ~1 s here, which froze every other thread of the host
            # (its gRPC server and health checks included) for as long.
            return self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    async def encode_async(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """encode() for request handlers: a long text is tokenized on a worker thread, so the
        event loop keeps serving every other stream."""
        if len(text) <= LONG_TEXT_CHARS:
            return self.encode(text, add_special_tokens=add_special_tokens)
        return await asyncio.to_thread(self.encode, text, add_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token decoded alone, special tokens included (a lone byte of a
        multi-byte character reads as U+FFFD), as the logprobs of OpenAI's API show it."""
        text = self._texts.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False) if token_id < self.vocab_size else ""
            self._texts[token_id] = text
        return text

    def token_bytes(self, token_id: int) -> bytes:
        """The token's own bytes (seam/token_bytes.py): what a lone byte of a multi-byte
        character is, where token_text shows U+FFFD."""
        data = self._bytes.get(token_id)
        if data is None:
            if self._token_bytes is None:
                decoder = self.tokenizer.decoder
                self._token_bytes = TokenBytes(decoder.__getstate__().decode() if decoder is not None else None)
            data = self._token_bytes.of(self.id_to_token(token_id), self.token_text(token_id))
            self._bytes[token_id] = data
        return data

    def id_to_token(self, token_id: int) -> str:
        return self.tokenizer.id_to_token(token_id) or ""

    def token_strings(self, ids: list[int]) -> list[str]:
        return [self.id_to_token(i) for i in ids]

    def max_chars_per_token(self) -> int | None:
        """See _max_chars_per_token; computed on first use (it walks the whole vocabulary),
        which only a text longer than max_model_len characters needs. Any thread may call it."""
        if self._max_chars_per_token is False:
            self._max_chars_per_token = _max_chars_per_token(self.tokenizer)
        return self._max_chars_per_token

    def backend_json(self) -> str:
        """The tokenizer as tokenizer.json text (xgrammar reads the vocabulary type from it)."""
        return self.tokenizer.to_str()


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


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


def _max_chars_per_token(tok: Tokenizer) -> int | None:
    """The most characters of input one token can stand for, or None when there is no such bound.

    A BPE token's string is what it matches (in byte-level BPE one character per byte,
    and an input character is at least one byte), so the longest one in the vocabulary
    bounds it. Not so where one unknown-token id may swallow a whole word (WordPiece,
    Unigram, BPE fusing unknown runs), and a normalizer may delete characters: it gets room.
    """
    model = tok.model
    if not isinstance(model, models.BPE):
        return None
    if model.unk_token is not None and model.fuse_unk and not model.byte_fallback:
        return None
    longest = max((len(t) for t in tok.get_vocab(with_added_tokens=True)), default=1)
    return max(longest, 1) * (2 if tok.normalizer is not None else 1)
