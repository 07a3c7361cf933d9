"""Triton tensors of the embed model <-> embedding jobs (no model state here).

The tensor contract is model_repository/embed/config.pbtxt: one request
carries every input of one API call, as `text_input` [n] strings or as
`input_ids` (all inputs' ids concatenated) with `input_lengths` [n]; its one
response carries `embedding` [n, dim] FP32 and `prompt_tokens` [n].
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from kvserve.backend.embed.embedder import Embedder
from kvserve.backend.triton import as_text, first_scalar
from kvserve.seam import embed_tensors as T
from kvserve.seam.error_wire import invalid
from kvserve.seam.tensors import TRACEPARENT_PARAM


@dataclass(slots=True)
class ParsedEmbedRequest:
    inputs: list[list[int]]
    dimensions: int | None
    normalize: bool | None
    traceparent: str | None


def _int_field(data: dict, name: str) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, "must be an integer")
    return value


def _pooling_parameters(pb_utils, request) -> dict:
    raw = first_scalar(pb_utils, request, T.POOLING_PARAMETERS)
    if raw is None:
        return {}
    try:
        data = json.loads(as_text(raw, T.POOLING_PARAMETERS))
    except json.JSONDecodeError as exc:
        raise invalid(T.POOLING_PARAMETERS, f"malformed JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise invalid(T.POOLING_PARAMETERS, "must be a JSON object")
    if set(data) - T.POOLING_FIELDS:
        raise invalid(T.POOLING_PARAMETERS, f"unknown field (known: {', '.join(sorted(T.POOLING_FIELDS))})")
    return data


def _truncation(data: dict, embedder: Embedder) -> int | None:
    value = _int_field(data, "truncate_prompt_tokens")
    if value is None:
        return None
    if value == -1:  # vLLM's "to the model's limit"
        return embedder.max_model_len
    if not 1 <= value <= embedder.max_model_len:
        raise invalid("truncate_prompt_tokens", f"must be -1 or between 1 and {embedder.max_model_len}")
    return value


def _id_inputs(pb_utils, request, limit: int) -> list[list[int]] | None:
    ids_tensor = pb_utils.get_input_tensor_by_name(request, T.INPUT_IDS)
    lens_tensor = pb_utils.get_input_tensor_by_name(request, T.INPUT_LENGTHS)
    if ids_tensor is None:
        if lens_tensor is not None:
            raise invalid(T.INPUT_LENGTHS, "only with input_ids")
        return None
    ids = ids_tensor.as_numpy().reshape(-1)
    if ids.dtype.kind not in "iu":
        raise invalid(T.INPUT_IDS, "must be an INT32 tensor")
    lens = lens_tensor.as_numpy().reshape(-1) if lens_tensor is not None else np.array([ids.size])
    if lens.dtype.kind not in "iu" or (lens < 0).any() or int(lens.sum()) != ids.size:
        raise invalid(T.INPUT_LENGTHS, "must be non-negative and add up to the number of input_ids")
    if lens.size > limit:
        raise invalid("input", f"at most {limit} inputs per request, got {lens.size}")
    flat = ids.tolist()
    out, start = [], 0
    for n in lens.tolist():
        out.append(flat[start:start + n])
        start += n
    return out


def parse_embed_request(pb_utils, request, embedder: Embedder) -> ParsedEmbedRequest:
    """Read, tokenize and check; any problem raises a RequestError naming the input or field."""
    data = _pooling_parameters(pb_utils, request)
    truncate = _truncation(data, embedder)
    normalize = data.get("normalize")
    if normalize is not None and not isinstance(normalize, bool):
        raise invalid("normalize", "must be a boolean")
    dimensions = _int_field(data, "dimensions")
    embedder.check_dimensions(dimensions)
    limit = embedder.config.max_inputs_per_request
    text_tensor = pb_utils.get_input_tensor_by_name(request, T.TEXT_INPUT)
    ids = _id_inputs(pb_utils, request, limit)
    if text_tensor is not None and ids is not None:
        raise invalid(T.TEXT_INPUT, "give either text_input or input_ids, not both")
    if text_tensor is not None:
        texts = [as_text(v, T.TEXT_INPUT) for v in text_tensor.as_numpy().reshape(-1)]
        if len(texts) > limit:
            raise invalid("input", f"at most {limit} inputs per request, got {len(texts)}")
        if any(not t for t in texts):
            raise invalid("input", f"input {next(i for i, t in enumerate(texts) if not t)} is an empty string")
        ids = embedder.tokenize(texts, truncate)
    elif ids is None:
        raise invalid(T.TEXT_INPUT, "one of text_input or input_ids is required")
    if not ids:
        raise invalid("input", "must not be empty")
    traceparent = None
    try:
        value = json.loads(request.parameters() or "{}").get(TRACEPARENT_PARAM)
        traceparent = value if isinstance(value, str) else None
    except (AttributeError, json.JSONDecodeError, TypeError):
        pass
    return ParsedEmbedRequest(embedder.check(ids, truncate), dimensions, normalize, traceparent)


def embed_tensors(pb_utils, embeddings: np.ndarray, prompt_tokens: list[int]) -> list:
    return [pb_utils.Tensor(T.EMBEDDING, np.ascontiguousarray(embeddings, dtype=np.float32)),
            pb_utils.Tensor(T.PROMPT_TOKENS, np.array(prompt_tokens, dtype=np.int32))]
