"""The model's tokenizer as the engine needs it: encode, decode ids, special tokens, EOS ids.

Uses the `tokenizers` library on tokenizer.json directly (fast, no transformers
import), with tokenizer_config.json / generation_config.json for the special
tokens that tokenizer.json does not carry; or the tokenizer a GGUF file carries
in its metadata (gguf_tokenizer.py), built the same way for the gateway.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, models


# Longer texts are tokenized without holding the GIL (and, in the gateway, off the event loop).
LONG_TEXT_CHARS = 16_384


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _token_text(value) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", ...} in older tokenizer configs
        return value.get("content")
    return value


class ModelTokenizer:
    def __init__(self, model_path: str | Path) -> None:
        from kvserve.backend.models.gguf_checkpoint import gguf_file
        gguf = gguf_file(model_path)
        if gguf is not None:
            self._from_gguf(gguf)
        else:
            self._from_folder(Path(model_path))
        self._tok.no_padding()
        self._tok.no_truncation()
        self.special_ids = frozenset(t.id if hasattr(t, "id") else k
                                     for k, t in self._tok.get_added_tokens_decoder().items() if t.special)
        self.vocab_size = self._tok.get_vocab_size()
        self._max_chars_per_token: int | None | bool = False  # False: not computed yet

    def _from_gguf(self, path: Path) -> None:
        from kvserve.backend.models.gguf_checkpoint import open_gguf
        from kvserve.backend.models.gguf_tokenizer import build_tokenizer
        built = build_tokenizer(open_gguf(path))
        self._tok = built.tokenizer
        self.eos_token_ids = built.eos_token_ids

    def _from_folder(self, model_dir: Path) -> None:
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"model: no tokenizer.json in {model_dir}")
        self._tok = Tokenizer.from_file(str(path))
        cfg = _read_json(model_dir / "tokenizer_config.json")
        gen = _read_json(model_dir / "generation_config.json")
        model_cfg = _read_json(model_dir / "config.json")
        eos: set[int] = set()
        for source in (gen.get("eos_token_id"), model_cfg.get("eos_token_id")):
            if isinstance(source, int):
                eos.add(source)
            elif isinstance(source, list):
                eos.update(int(t) for t in source)
        eos_text = _token_text(cfg.get("eos_token"))
        if eos_text and self._tok.token_to_id(eos_text) is not None:
            eos.add(self._tok.token_to_id(eos_text))
        self.eos_token_ids = frozenset(eos)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > LONG_TEXT_CHARS:
            # `tokenizers` holds the GIL through encode() but not through encode_batch(): a
            # megabyte of text takes ~1 s here, which froze every other thread of the host
            # (its gRPC server and health checks included) for as long.
            return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def max_chars_per_token(self) -> int | None:
        """See _max_chars_per_token; computed on first use (it walks the whole vocabulary),
        which only a text longer than max_model_len characters needs. Any thread may call it."""
        if self._max_chars_per_token is False:
            self._max_chars_per_token = _max_chars_per_token(self._tok)
        return self._max_chars_per_token

    def backend_json(self) -> str:
        """The tokenizer as tokenizer.json text (xgrammar reads the vocabulary type from it)."""
        return self._tok.to_str()

    def id_to_token(self, token_id: int) -> str:
        return self._tok.id_to_token(token_id) or ""


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
