"""Admission: a prompt and its sampling parameters -> validated token ids, or a RequestError.

One stateless function, `admit`, run once per request: by `LLMEngine.add_request`
for the offline `LLM`, and by `AsyncEngine` off the engine thread (which then
hands the engine an `AdmittedPrompt` it does not check again). `precheck` is its
part that needs no tokenizer, run first, so that a prompt which cannot fit is
refused before anyone spends seconds tokenizing megabytes of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from kvserve.backend.engine.sampling_params import SamplingParams
from kvserve.seam.error_wire import ErrorKind, RequestError, invalid
from kvserve.seam.limits import kept_prompt_tokens


@dataclass(frozen=True, slots=True)
class PromptLimits:
    vocab_size: int
    max_model_len: int
    # No token covers more characters than this, so a text longer than max_model_len
    # times it cannot fit; None when the tokenizer gives no such bound. A function:
    # the tokenizer works it out on first use (ModelTokenizer.max_chars_per_token).
    max_chars_per_token: Callable[[], int | None]
    priority_scheduling: bool = False  # --scheduling-policy priority: a request's priority is honoured

    def too_many_chars(self, num_chars: int) -> bool:
        if num_chars <= self.max_model_len:  # a token is at least one character: no need to ask
            return False
        bound = self.max_chars_per_token()
        return bound is not None and num_chars > self.max_model_len * bound


@dataclass(frozen=True, slots=True)
class AdmittedPrompt:
    """A prompt that passed `admit`: the engine takes it without checking again."""
    token_ids: list[int]
    text: str | None  # the prompt as given, when it was text


def _too_long(detail: str) -> RequestError:
    return RequestError(f"context_length_exceeded: {detail}", "prompt", ErrorKind.CONTEXT_LENGTH)


def precheck(prompt: str | list[int], params: SamplingParams, limits: PromptLimits) -> None:
    """The checks that need no tokenization: emptiness, the vocabulary, and length by counting characters."""
    if not prompt:
        raise invalid("prompt", "must not be empty")
    params.check_vocab(limits.vocab_size)
    if params.priority and not limits.priority_scheduling:  # as vLLM: never silently ignored
        raise invalid("priority", "priority scheduling is not enabled (--scheduling-policy priority)")
    if params.truncate_prompt_tokens is not None:
        return  # cut to fit after tokenizing
    if isinstance(prompt, str):
        if limits.too_many_chars(len(prompt)):
            raise _too_long(f"the prompt has {len(prompt)} characters, more than fit in this model's maximum "
                            f"context length of {limits.max_model_len} tokens")
    elif len(prompt) >= limits.max_model_len:
        _check_length(len(prompt), params, limits)


def admit(prompt: str | list[int], params: SamplingParams, limits: PromptLimits,
          encode: Callable[..., list[int]]) -> AdmittedPrompt:
    """Validate a prompt against the model (RequestError names the field) and tokenize it (with
    `encode(text)`; bad words and a predicted output with `encode(word, add_special_tokens=False)`)."""
    precheck(prompt, params, limits)
    if isinstance(prompt, str):
        ids = encode(prompt)
        text = prompt
    else:
        ids = list(prompt)
        text = None
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 or t >= limits.vocab_size for t in ids):
            raise invalid("prompt", f"token ids must be integers in [0, {limits.vocab_size})")
    if not ids:
        raise invalid("prompt", "must not be empty")
    if params.truncate_prompt_tokens is not None:  # the end of a prompt is what the reply follows
        ids = ids[-kept_prompt_tokens(len(ids), params.truncate_prompt_tokens, params.max_tokens,
                                      limits.max_model_len):]
    _check_length(len(ids), params, limits)
    if params.bad_words:
        params.tokenize_bad_words(encode)
    if params.prediction:
        params.prediction_token_ids = np.asarray(encode(params.prediction, add_special_tokens=False), dtype=np.int64)
    return AdmittedPrompt(ids, text)


def _check_length(num_tokens: int, params: SamplingParams, limits: PromptLimits) -> None:
    if num_tokens >= limits.max_model_len:
        raise _too_long(f"the prompt has {num_tokens} tokens; this model's maximum context length is "
                        f"{limits.max_model_len} tokens")
    if params.max_tokens is not None and num_tokens + params.max_tokens > limits.max_model_len:
        raise _too_long(f"prompt ({num_tokens} tokens) + max_tokens ({params.max_tokens}) exceed the "
                        f"maximum context length {limits.max_model_len}")
