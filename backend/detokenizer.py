"""Incremental detokenization with stop strings.

Decoding token by token is wrong for byte-level BPE (a character can span
tokens) and for tokenizers that merge spaces, so each step decodes a small
window: the tokens since `prefix_offset` with and without the new ones; the
difference is the new text. A window ending in U+FFFD is an unfinished UTF-8
character, and its text waits for the next token.

Stop strings may span tokens: text that could still be the start of a stop
string is held back until it either completes one (the request stops, the stop
string is cut) or cannot any more (the text is released).
"""
from __future__ import annotations

from dataclasses import dataclass

from kvserve.backend.tokenizer import ModelTokenizer

_REPLACEMENT = "\ufffd"


@dataclass(slots=True)
class DetokenizerResult:
    text_delta: str
    stop_string: str | None  # the stop string that matched, if any


class IncrementalDetokenizer:
    def __init__(self, tokenizer: ModelTokenizer, prompt_ids: list[int], stop: list[str],
                 include_stop_str_in_output: bool, skip_special_tokens: bool) -> None:
        self.tok = tokenizer
        self.stop = stop
        self.include_stop = include_stop_str_in_output
        self.skip_special = skip_special_tokens
        # Context from the prompt's tail so the first output token decodes with its left neighbours.
        self.ids: list[int] = list(prompt_ids[-6:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""        # all decoded output text so far
        self.emitted = 0      # characters of self.text already handed to the client
        self.checked = 0      # characters of self.text no new stop match may end in (searched, or before min_tokens)

    def add_tokens(self, new_ids: list[int], finished: bool = False, check_stop: bool = True) -> DetokenizerResult:
        """The new text to hand out. `check_stop=False` while the request has not yet reached
        min_tokens: a stop string there neither stops it nor is cut from the text (vLLM)."""
        for token_id in new_ids:
            self.ids.append(token_id)
            self.text += self._decode_step()
            if self.stop and check_stop:
                match = self._find_stop()
                if match is not None:
                    return match
            self.checked = len(self.text)
        # Hold back what could still grow into a stop string, unless nothing more will come.
        hold = 0 if finished else self._stop_prefix_len()
        end = len(self.text) - hold
        delta = self.text[self.emitted:end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return DetokenizerResult(delta, None)

    def _decode_step(self) -> str:
        prefix = self.tok.decode(self.ids[self.prefix_offset:self.read_offset], self.skip_special)
        full = self.tok.decode(self.ids[self.prefix_offset:], self.skip_special)
        if full.endswith(_REPLACEMENT) or len(full) <= len(prefix):
            return ""  # an unfinished character (or nothing visible yet): wait for more tokens
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return full[len(prefix):]

    def _find_stop(self) -> DetokenizerResult | None:
        # Only a match that ends in the text not checked yet is new: one that ended earlier was
        # found then, or came before min_tokens and must not count (as vLLM).
        best: tuple[int, str] | None = None
        for s in self.stop:
            i = self.text.find(s, max(0, self.checked - len(s) + 1))
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        idx, s = best
        end = idx + len(s) if self.include_stop else idx
        self.text = self.text[:end]
        delta = self.text[self.emitted:] if end > self.emitted else ""
        self.emitted = len(self.text)
        return DetokenizerResult(delta, s)

    def _stop_prefix_len(self) -> int:
        """Length of the longest suffix of the unemitted text that is a proper prefix of a stop string."""
        if not self.stop:
            return 0
        pending = self.text[self.emitted:]
        longest = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(pending)), longest, -1):
                if pending.endswith(s[:k]):
                    longest = k
                    break
        return longest
