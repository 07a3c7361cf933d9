"""Sampling parameters of one request. Every bad value raises a ValueError (`RequestError`, from `invalid`) naming the field.

The messages name the field and the rule, never the value: a direct gRPC client's error must not
carry its own request's bytes back (reflected into a log viewer or a page, they are an injection).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from kvserve.backend.structured import GrammarSpec, parse_spec
from kvserve.seam.error_wire import invalid
from kvserve.seam.limits import (DEFAULT_MAX_TOKENS, INT64_MAX, INT64_MIN, MAX_ALLOWED_TOKEN_IDS, MAX_LOGIT_BIAS,
                                 MAX_LOGIT_BIAS_VALUE, MAX_LOGPROBS, MAX_N, MAX_PREDICTION_CHARS, MAX_STOP,
                                 MAX_STOP_CHARS, MAX_TIMEOUT_S)


@dataclass(slots=True)
class SamplingParams:
    n: int = 1
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None  # None: off; k: sampled token plus the top k
    # None: off; k: each prompt token's logprob given the tokens before it, plus the top k there
    # (vLLM's prompt_logprobs; what `echo` with `logprobs` reports). The request then reads no
    # prefix-cache hits: a cached position's logits are never computed.
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    # vLLM's: sampling only among these ids (None: all)
    allowed_token_ids: list[int] | None = None
    # vLLM's: these words are never generated. Admission tokenizes each (as written and after a
    # space) into `bad_words_token_ids`; a one-token word is banned always, a longer one's last
    # token when the output ends with the rest of it.
    bad_words: list[str] = field(default_factory=list)
    # vLLM's: keep only the prompt's last k tokens (-1: as many as fit beside max_tokens)
    truncate_prompt_tokens: int | None = None
    skip_special_tokens: bool = True
    cache_salt: str | None = None
    timeout: float | None = None  # seconds from arrival; the request ends with finish_reason "abort"
    # vLLM's request priority: lower runs first under --scheduling-policy priority (0 otherwise)
    priority: int = 0
    # vLLM's StructuredOutputsParams ({"json": schema} | {"regex": ...} | ...): see structured/spec.py
    structured_outputs: dict[str, Any] | None = None
    # OpenAI's predicted output: text the reply is expected to repeat much of (a file being edited).
    # It never changes what is generated; with speculative decoding (ngram or suffix) the speculator
    # proposes from it. Admission tokenizes it into `prediction_token_ids`.
    prediction: str | None = None
    grammar: GrammarSpec | None = field(default=None, init=False, repr=False)  # structured_outputs, checked
    bad_words_token_ids: list[list[int]] = field(default_factory=list, init=False, repr=False)  # set at admission
    allowed_index: Any = field(default=None, init=False, repr=False)  # allowed_token_ids as the sampler's tensor
    # set at admission, as the array the speculator reads at every step (not converted again each time)
    prediction_token_ids: Any = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.bad_words = list(self.bad_words or [])
        self.logit_bias = {int(k): v for k, v in (self.logit_bias or {}).items()} if _is_int_keyed(
            self.logit_bias) else self.logit_bias
        self._validate()

    def _validate(self) -> None:
        _int_in("n", self.n, 1, MAX_N)
        if self.max_tokens is not None:
            _int_in("max_tokens", self.max_tokens, 1, None)
        _int_in("min_tokens", self.min_tokens, 0, None)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise invalid("min_tokens", "must be <= max_tokens")
        _float_in("temperature", self.temperature, 0.0, 100.0)
        _float_in("top_p", self.top_p, 0.0, 1.0, low_open=True)
        if not _is_int(self.top_k) or (self.top_k < 0 and self.top_k != -1):
            raise invalid("top_k", "must be -1, 0 (disabled) or a positive integer")
        _float_in("min_p", self.min_p, 0.0, 1.0)
        _float_in("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _float_in("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _float_in("repetition_penalty", self.repetition_penalty, 0.0, 2.0, low_open=True)
        if self.seed is not None and (not _is_int(self.seed) or not INT64_MIN <= self.seed <= INT64_MAX):
            raise invalid("seed", "must be an integer that fits in an int64")
        if len(self.stop) > MAX_STOP:
            raise invalid("stop", f"at most {MAX_STOP} stop strings")
        for s in self.stop:
            if not isinstance(s, str) or not s or len(s) > MAX_STOP_CHARS:
                raise invalid("stop", f"each stop string must be a non-empty string of at most "
                                      f"{MAX_STOP_CHARS} characters")
        if len(self.stop_token_ids) > MAX_STOP or not all(
                _is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise invalid("stop_token_ids", f"must be a list of at most {MAX_STOP} non-negative integers")
        if self.logprobs is not None:
            _int_in("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        if self.prompt_logprobs is not None:
            _int_in("prompt_logprobs", self.prompt_logprobs, 0, MAX_LOGPROBS)
        if not isinstance(self.logit_bias, dict) or len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise invalid("logit_bias", f"must be a map of at most {MAX_LOGIT_BIAS} token ids to biases")
        for token, bias in self.logit_bias.items():
            if not _is_int(token) or token < 0:
                raise invalid("logit_bias", "token ids must be non-negative integers")
            _float_in("logit_bias", bias, -MAX_LOGIT_BIAS_VALUE, MAX_LOGIT_BIAS_VALUE)
        if self.allowed_token_ids is not None and (
                not isinstance(self.allowed_token_ids, list) or not 0 < len(self.allowed_token_ids) <= MAX_ALLOWED_TOKEN_IDS
                or not all(_is_int(t) and t >= 0 for t in self.allowed_token_ids)):
            raise invalid("allowed_token_ids", f"must be a list of 1 to {MAX_ALLOWED_TOKEN_IDS} non-negative integers")
        if len(self.bad_words) > MAX_STOP or not all(
                isinstance(w, str) and w.strip() and len(w) <= MAX_STOP_CHARS for w in self.bad_words):
            raise invalid("bad_words", f"must be a list of at most {MAX_STOP} words of 1 to {MAX_STOP_CHARS} "
                                       "characters (not only spaces)")
        if self.truncate_prompt_tokens is not None and (
                not _is_int(self.truncate_prompt_tokens) or self.truncate_prompt_tokens == 0
                or self.truncate_prompt_tokens < -1):
            raise invalid("truncate_prompt_tokens", "must be -1 or a positive integer")
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str) or not self.cache_salt):
            raise invalid("cache_salt", "must be a non-empty string")
        if self.timeout is not None:
            _float_in("timeout", self.timeout, 0.0, MAX_TIMEOUT_S, low_open=True)
        if not _is_int(self.priority) or not INT64_MIN <= self.priority <= INT64_MAX:
            raise invalid("priority", "must be an integer that fits in an int64")
        if self.prediction is not None and (not isinstance(self.prediction, str)
                                            or len(self.prediction) > MAX_PREDICTION_CHARS):
            raise invalid("prediction", f"must be a string of at most {MAX_PREDICTION_CHARS} characters")
        if self.structured_outputs is not None:
            self.grammar = parse_spec(self.structured_outputs)
        for name in ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise invalid(name, "must be a boolean")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    def check_vocab(self, vocab_size: int) -> None:
        """Checks that need the model: token ids in range, top_k within the vocabulary."""
        if self.top_k > vocab_size:
            raise invalid("top_k", f"must be <= the vocabulary size {vocab_size}")
        for t in self.stop_token_ids:
            if t >= vocab_size:
                raise invalid("stop_token_ids", f"a token id is outside the vocabulary (0..{vocab_size - 1})")
        for t in self.logit_bias:
            if t >= vocab_size:
                raise invalid("logit_bias", f"a token id is outside the vocabulary (0..{vocab_size - 1})")
        if self.allowed_token_ids is not None and max(self.allowed_token_ids) >= vocab_size:
            raise invalid("allowed_token_ids", f"a token id is outside the vocabulary (0..{vocab_size - 1})")

    def tokenize_bad_words(self, encode: Callable[..., list[int]]) -> None:
        """`bad_words_token_ids`, as vLLM forms them: each word as written (leading spaces dropped)
        and, where it tokenizes differently but to as many tokens, after a space."""
        out: list[list[int]] = []
        for word in self.bad_words:
            bare = encode(word.lstrip(), add_special_tokens=False)
            if bare:
                out.append(bare)
            spaced = encode(" " + word.lstrip(), add_special_tokens=False)
            if spaced and bare and spaced[0] != bare[0] and len(spaced) == len(bare):
                out.append(spaced)
        self.bad_words_token_ids = out

    @classmethod
    def from_dict(cls, data: Any) -> "SamplingParams":
        """From JSON (the Triton `sampling_parameters` input): unknown keys are an error, not ignored."""
        if not isinstance(data, dict):
            raise invalid("sampling_parameters", "must be a JSON object")
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(data) - known)
        if unknown:
            raise invalid("sampling_parameters", "has an unknown field")
        values = {k: v for k, v in data.items() if v is not None}  # JSON keys of logit_bias: see __post_init__
        try:
            return cls(**values)
        except TypeError as exc:
            raise invalid("sampling_parameters", "a field has the wrong type") from None


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond a float's range (JSON allows any number of digits)
        return False


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_int_keyed(mapping: Any) -> bool:
    return isinstance(mapping, dict) and all(isinstance(k, (int, str)) and str(k).lstrip("-").isdigit()
                                             for k in mapping)


def _int_in(name: str, value: Any, low: int, high: int | None) -> None:
    if not _is_int(value) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise invalid(name, f"must be an integer {bound}")


def _float_in(name: str, value: Any, low: float, high: float, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
        raise invalid(name, "must be a finite number")
    if value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise invalid(name, f"must be in {bracket}{low}, {high}]")
