"""A token's own bytes, for the `bytes` field of chat logprobs.

A token can hold part of a character: SmolLM2's three tokens of "😀" are the bytes F0 9F, 98 and
80. Decoded alone each reads as U+FFFD, and OpenAI's `bytes` field exists so that a client can
join the tokens' bytes back into the text. So the bytes come from the token's vocabulary string,
read the way the tokenizer's decoder reads it:
- byte-level BPE (GPT-2's scheme: SmolLM2, Llama 3, Qwen): each character of the string stands
  for one byte, by the fixed table below;
- byte fallback (SentencePiece: Gemma, Llama 2): a `<0xNN>` piece is the byte NN, any other piece
  is its text after the decoder's replacements (`▁` is a space).
Anything else (and a token the scheme cannot spell, such as an added special token with a space)
is its decoded text's UTF-8. Standard library only: the tokenizer module passes in the decoder's
JSON and the token's string.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte-to-character table, inverted: printable Latin-1 bytes stand for themselves,
    the other 68 (controls, space, a few Latin-1 ones) for the characters from U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table.values():
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


class TokenBytes:
    """Reads token strings as the decoder described by `decoder_json` (tokenizer.json's `decoder`)."""

    def __init__(self, decoder_json: str | None) -> None:
        parts = _decoder_parts(json.loads(decoder_json) if decoder_json else None)
        kinds = {p.get("type") for p in parts}
        self.byte_level = "ByteLevel" in kinds
        self.byte_fallback = "ByteFallback" in kinds
        self.replacements = [(p["pattern"]["String"], p["content"]) for p in parts
                             if p.get("type") == "Replace" and isinstance(p.get("pattern"), dict)
                             and isinstance(p["pattern"].get("String"), str) and isinstance(p.get("content"), str)]

    def of(self, piece: str | None, text: str) -> bytes:
        """The bytes of a token whose vocabulary string is `piece` and whose decoded text is `text`."""
        if piece:
            if self.byte_level:
                table = _byte_level_table()
                if all(c in table for c in piece):
                    return bytes(table[c] for c in piece)
            elif self.byte_fallback:
                match = _BYTE_PIECE.fullmatch(piece)
                if match:
                    return bytes([int(match.group(1), 16)])
                for pattern, content in self.replacements:
                    piece = piece.replace(pattern, content)
                return piece.encode("utf-8")
        return text.encode("utf-8")


def _decoder_parts(decoder) -> list[dict]:
    if not isinstance(decoder, dict):
        return []
    if decoder.get("type") == "Sequence":
        return [p for p in decoder.get("decoders") or [] if isinstance(p, dict)]
    return [decoder]
