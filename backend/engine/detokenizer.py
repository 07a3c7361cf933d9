"""Incremental detokenization with stop strings.

Decoding token by token is wrong for byte-level BPE (a character can span
tokens) and for tokenizers that merge spaces, so each step decodes a small
window: the tokens since the last clean boundary, with a few before them as
context; what the window decodes to beyond the text already handed out is the
new text. A window ending in U+FFFD is an unfinished UTF-8 character, and its
text waits for the next token.

The cost of a token is bounded whatever the output holds. A run of tokens
that never decodes cleanly (lone bytes that are not UTF-8, special tokens
skipped from the text) used to keep the window open, so each step decoded the
whole run again: quadratic, 16k forced byte tokens took 22 s of engine thread.
After `_MAX_HELD` such tokens the window releases everything but the last
`_UTF8_TAIL` replacement characters (an unfinished character is at most three
bytes) and drops the middle of the run, keeping its context and last tokens.
The text itself is not kept: only what is held back for stop strings.

Stop strings may span tokens: text that could still be the start of a stop
string is held back until it either completes one (the request stops, the stop
string is cut) or cannot any more (the text is released). One automaton
(stop_matcher.py) reads each character once for all the stop strings.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvserve.backend.engine.stop_matcher import stop_automaton
from kvserve.seam.tokenizer import ModelTokenizer

_REPLACEMENT = "\ufffd"
_CONTEXT_TOKENS = 6   # prompt tokens the first output token decodes with
_MAX_HELD = 16        # tokens a window may hold without decoding cleanly before it gives up waiting
_UTF8_TAIL = 3        # bytes (so tokens, and replacement characters) an unfinished character can span


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
        # window[:read] is context whose text is out (`sent` characters of window's decode);
        # window[read:] are tokens whose text is not out yet.
        self.window: list[int] = list(prompt_ids[-_CONTEXT_TOKENS:])
        self.read = len(self.window)
        self.sent = len(self._decode(self.window))
        self.pending = ""     # decoded text not yet handed to the client (held for stop strings)
        self.emitted = 0      # characters handed to the client so far
        self._stops = None    # the automaton, looked up at the first token (a waiting request holds none)
        self._stop_key = tuple(stop)
        self._node = 0        # the automaton's state after all decoded text

    @property
    def has_held_text(self) -> bool:
        return bool(self.pending)

    def add_tokens(self, new_ids: list[int], finished: bool = False, check_stop: bool = True) -> DetokenizerResult:
        """The new text to hand out. `check_stop=False` while the request has not yet reached
        min_tokens: a stop string there neither stops it nor is cut from the text (vLLM)."""
        if self._stop_key and self._stops is None:
            self._stops = stop_automaton(self._stop_key)
        for token_id in new_ids:
            piece = self._decode_step(token_id)
            if self._stops is not None and piece:
                match = self._read_stops(piece, check_stop)
                if match is not None:
                    return match
            else:
                self.pending += piece
        # Hold back what could still grow into a stop string, unless nothing more will come.
        hold = 0 if finished or self._stops is None else min(self._stops.hold[self._node], len(self.pending))
        delta = self.pending[:len(self.pending) - hold]
        self.pending = self.pending[len(delta):]
        self.emitted += len(delta)
        return DetokenizerResult(delta, None)

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, self.skip_special)

    def _decode_step(self, token_id: int) -> str:
        self.window.append(token_id)
        full = self._decode(self.window)
        if not full.endswith(_REPLACEMENT) and len(full) > self.sent:
            # A clean boundary: the tokens just read become the next step's context.
            self.window = self.window[self.read:]
            self.read = len(self.window)
            text, self.sent = full[self.sent:], len(self._decode(self.window))
            return text
        if len(self.window) - self.read <= _MAX_HELD:
            return ""  # an unfinished character (or nothing visible yet): wait for more tokens
        # Not a character in the making any more: keep the context and the last few tokens.
        self.window = self.window[:self.read] + self.window[-_UTF8_TAIL:]
        rest = self._decode(self.window)
        held = min(_trailing_replacements(full), _trailing_replacements(rest), _UTF8_TAIL)
        end = len(full) - held
        text = full[self.sent:end] if end > self.sent else ""
        self.sent = max(0, len(rest) - held)
        return text

    def _read_stops(self, piece: str, check_stop: bool) -> DetokenizerResult | None:
        # Only a match that ends in this piece is new: one that ended earlier was found then, or
        # came before min_tokens and must not count (as vLLM). Of the matches ending here, the
        # one starting first wins (then the first in the list).
        auto, node, base = self._stops, self._node, len(self.pending)
        best: tuple[int, int] | None = None  # (start in pending + piece, stop index)
        for i, ch in enumerate(piece):
            node = auto.step(node, ch)
            if check_stop and (auto.word[node] >= 0 or auto.dict_link[node] >= 0):
                for k in auto.matches(node):
                    start = base + i + 1 - len(self.stop[k])
                    if best is None or (start, k) < best:
                        best = (start, k)
        self._node = node
        self.pending += piece
        if best is None:
            return None
        start, k = best
        s = self.stop[k]
        # Text that could begin a stop string is never handed out, so the match starts in pending.
        end = max(0, start) + (len(s) if self.include_stop else 0)
        delta = self.pending[:end]
        self.pending = ""
        self.emitted += len(delta)
        return DetokenizerResult(delta, s)


def _trailing_replacements(text: str) -> int:
    return len(text) - len(text.rstrip(_REPLACEMENT))
