"""Triton tensors <-> engine requests and outputs, for model.py (no engine state here).

The tensor names are kvserve.seam.tensors (config.pbtxt declares the same,
tests/contract checks it): one response per choice per step, deltas only; the
last response of a request carries the FINAL flag.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from kvserve.backend.engine import CompletionOutput, SamplingParams, TokenLogprob
from kvserve.seam import tensors as T
from kvserve.seam.error_wire import invalid
from kvserve.seam.limits import MAX_PROMPT_TOKENS


@dataclass(slots=True)
class ParsedRequest:
    prompt: str | list[int]
    params: SamplingParams
    stream: bool
    traceparent: str | None
    lora_name: str | None = None  # the adapter it runs with (seam.tensors.LORA_NAME_PARAM); None: the base model


@dataclass(slots=True)
class ChoiceTotals:
    """Per-choice running totals (completion_tokens is cumulative; non-streaming aggregates)."""
    completion_tokens: int = 0
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)


def first_scalar(pb_utils, request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    arr = tensor.as_numpy()
    if arr.size == 0:
        raise invalid(name, "must not be empty")
    return arr.reshape(-1)[0]


def as_text(value, name: str) -> str:
    if isinstance(value, (bytes, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise invalid(name, "must be valid UTF-8") from None
    if isinstance(value, str):
        return value
    raise invalid(name, "must be a string (BYTES tensor)")


def _sampling_parameters(text: str):
    """The sampling parameters JSON, parsed; a RequestError naming the tensor when it does not parse."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise invalid(T.SAMPLING_PARAMETERS, f"malformed JSON ({exc.msg})") from None
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise invalid(T.SAMPLING_PARAMETERS, "malformed JSON (a number with too many digits)") from None


def parse_request(pb_utils, request) -> ParsedRequest:
    """Read inputs; any problem raises ValueError naming the input or field."""
    text = first_scalar(pb_utils, request, T.TEXT_INPUT)
    ids_tensor = pb_utils.get_input_tensor_by_name(request, T.INPUT_IDS)
    if text is not None and ids_tensor is not None:
        raise invalid(T.TEXT_INPUT, f"give either {T.TEXT_INPUT} or {T.INPUT_IDS}, not both")
    if text is not None:
        prompt: str | list[int] = as_text(text, T.TEXT_INPUT)
    elif ids_tensor is not None:
        arr = ids_tensor.as_numpy()
        if arr.dtype.kind not in "iu":
            raise invalid(T.INPUT_IDS, "must be an INT32 tensor")
        if arr.size > MAX_PROMPT_TOKENS:
            raise invalid(T.INPUT_IDS, "too many tokens")
        prompt = [int(x) for x in arr.reshape(-1)]
    else:
        raise invalid(T.TEXT_INPUT, f"one of {T.TEXT_INPUT} or {T.INPUT_IDS} is required")
    raw = first_scalar(pb_utils, request, T.SAMPLING_PARAMETERS)
    sampling_json = as_text(raw, T.SAMPLING_PARAMETERS) if raw is not None else "{}"
    try:
        params = SamplingParams.from_dict(_sampling_parameters(sampling_json))
    except RecursionError:  # nested deeper than the parser (or a value's repr) can go
        raise invalid(T.SAMPLING_PARAMETERS, "nested too deeply") from None
    stream = first_scalar(pb_utils, request, T.STREAM)
    traceparent = lora_name = None
    try:
        extra = json.loads(request.parameters() or "{}")
    except (AttributeError, json.JSONDecodeError, TypeError):
        extra = {}
    value = extra.get(T.TRACEPARENT_PARAM)
    traceparent = value if isinstance(value, str) else None
    lora = extra.get(T.LORA_NAME_PARAM)
    if lora is not None:
        if not isinstance(lora, str) or not lora:
            raise invalid("model", "a LoRA adapter's name must be a non-empty string")
        lora_name = lora
    return ParsedRequest(prompt, params, bool(stream) if stream is not None else True, traceparent, lora_name)


def request_parameter(request, name: str):
    """A Triton request's parameter `name` (request.parameters() is JSON), else None."""
    try:
        return json.loads(request.parameters() or "{}").get(name)
    except (AttributeError, json.JSONDecodeError, TypeError):
        return None


def is_describe_request(request) -> bool:
    """The gateway asking what this model serves (seam.tensors.DESCRIBE_PARAM), not a prompt."""
    return request_parameter(request, T.DESCRIBE_PARAM) is True


def engine_control_action(request) -> str | None:
    """The action of an engine control request (seam.tensors.ENGINE_CONTROL_PARAM), else None."""
    value = request_parameter(request, T.ENGINE_CONTROL_PARAM)
    return value if isinstance(value, str) else None


def describe_tensors(pb_utils, facts: dict) -> list:
    """The answer to a describe request: TEXT_OUTPUT holds the facts (seam.tensors.MODEL_FACTS) as JSON."""
    assert set(facts) == set(T.MODEL_FACTS), facts
    return text_tensors(pb_utils, json.dumps(facts))


def text_tensors(pb_utils, text: str) -> list:
    """A one-off answer (describe, LoRA control): TEXT_OUTPUT holds `text`."""
    return [pb_utils.Tensor(T.TEXT_OUTPUT, np.array([text.encode()], dtype=np.object_))]


def logprob_arrays(entries: list[TokenLogprob], k: int) -> tuple[np.ndarray, np.ndarray]:
    """[tokens, 1 + k] ids and logprobs: the sampled token, then its top k (numbers only:
    the gateway, which has the tokenizer, renders their text)."""
    ids = np.empty((len(entries), 1 + k), dtype=np.int32)
    values = np.empty((len(entries), 1 + k), dtype=np.float32)
    for row, e in enumerate(entries):
        ids[row, 0], values[row, 0] = e.token_id, e.logprob
        for col, (token_id, logprob) in enumerate(e.top[:k], start=1):
            ids[row, col], values[row, col] = token_id, logprob
        for col in range(1 + len(e.top[:k]), 1 + k):  # never short (the sampler takes exactly k): defensive
            ids[row, col], values[row, col] = -1, -np.inf
    return ids, values


def prompt_logprob_tensors(pb_utils, prompt_token_ids: list[int], entries: list[TokenLogprob | None],
                           k: int) -> list:
    """PROMPT_LOGPROB_IDS / _VALUES / _RANKS: row 0, the first prompt token, has no logprob (NaN)
    and no rank (0)."""
    rows = [TokenLogprob(prompt_token_ids[0], float("nan"), rank=0), *entries[1:]]
    ids, values = logprob_arrays(rows, k)
    ranks = np.array([e.rank or 0 for e in rows], dtype=np.int32)
    return [pb_utils.Tensor(T.PROMPT_LOGPROB_IDS, ids), pb_utils.Tensor(T.PROMPT_LOGPROB_VALUES, values),
            pb_utils.Tensor(T.PROMPT_LOGPROB_RANKS, ranks)]


def choice_tensors(pb_utils, choice: CompletionOutput, totals: ChoiceTotals, prompt_tokens: int,
                   cached_tokens: int, logprobs: int | None) -> list:
    """The output tensors of one response for one choice (text/ids/logprobs are this response's delta)."""
    tensors = [
        pb_utils.Tensor(T.TEXT_OUTPUT, np.array([choice.text.encode("utf-8")], dtype=np.object_)),
        pb_utils.Tensor(T.OUTPUT_IDS, np.array(choice.token_ids, dtype=np.int32)),
        pb_utils.Tensor(T.FINISH_REASON, np.array([(choice.finish_reason or "").encode()], dtype=np.object_)),
        pb_utils.Tensor(T.INDEX, np.array([choice.index], dtype=np.int32)),
        pb_utils.Tensor(T.PROMPT_TOKENS, np.array([prompt_tokens], dtype=np.int32)),
        pb_utils.Tensor(T.COMPLETION_TOKENS, np.array([totals.completion_tokens], dtype=np.int32)),
        pb_utils.Tensor(T.CACHED_TOKENS, np.array([cached_tokens], dtype=np.int32)),
    ]
    if logprobs is not None:  # the request's k
        ids, values = logprob_arrays(choice.logprobs or [], logprobs)
        tensors.append(pb_utils.Tensor(T.LOGPROB_IDS, ids))
        tensors.append(pb_utils.Tensor(T.LOGPROB_VALUES, values))
    return tensors
