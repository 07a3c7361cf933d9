"""Typed readers for JSON request fields. Each raises a 400 `ApiError` whose
`param` names the field, with a message that never echoes large values.

JSON booleans are not integers here (Python's `True` is an `int`; OpenAI's API
rejects `"n": true`), and numbers must be finite.
"""
from __future__ import annotations

import math
from typing import Any

from kvserve.frontend.openai.api_errors import ApiError, bad_request
from kvserve.seam.limits import INT64_MAX, INT64_MIN, MAX_LOGIT_BIAS_VALUE


def _type_error(name: str, expected: str) -> ApiError:
    return bad_request(f"'{name}' must be {expected}", param=name)


def _range_text(lo: float | None, hi: float | None, lo_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f"between {lo} and {hi}" + (f" (greater than {lo})" if lo_open else "")
    if lo is not None:
        return f"greater than {lo}" if lo_open else f">= {lo}"
    return f"<= {hi}"


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def opt_bool(body: dict[str, Any], name: str) -> bool | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise _type_error(name, "a boolean")
    return value


def opt_int(body: dict[str, Any], name: str, lo: int | None = None, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not is_int(value):
        raise _type_error(name, "an integer")
    lo = INT64_MIN if lo is None else max(lo, INT64_MIN)  # int64 at most: seam/limits.py says why
    hi = INT64_MAX if hi is None else min(hi, INT64_MAX)
    if value < lo or value > hi:
        raise bad_request(f"'{name}' must be {_range_text(lo, hi)}", param=name)
    return value


def opt_number(
    body: dict[str, Any], name: str, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False
) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise _type_error(name, "a number")
    # Compared before any conversion: a JSON integer of 400 digits is a Python int that
    # float() (and math.isfinite) cannot take; int/float comparisons are exact.
    too_low = lo is not None and (value <= lo if lo_open else value < lo)
    if too_low or (hi is not None and value > hi):
        raise bad_request(f"'{name}' must be {_range_text(lo, hi, lo_open)}", param=name)
    try:
        return float(value)
    except OverflowError:
        raise bad_request(f"'{name}' is too large", param=name) from None


def opt_prompt_truncation(body: dict[str, Any], minus_one: str) -> int | None:
    """vLLM's `truncate_prompt_tokens`: read N of the prompt's tokens (generation keeps the last,
    embeddings the first, as each model family is cut); -1 means `minus_one`."""
    truncate = opt_int(body, "truncate_prompt_tokens", -1)
    if truncate == 0:
        raise bad_request(f"'truncate_prompt_tokens' must be -1 ({minus_one}) or >= 1", param="truncate_prompt_tokens")
    return truncate


def opt_str(body: dict[str, Any], name: str, *, max_len: int = 1024, allow_empty: bool = True) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _type_error(name, "a string")
    if len(value) > max_len:
        raise bad_request(f"'{name}' is longer than {max_len} characters", param=name)
    if not allow_empty and not value:
        raise bad_request(f"'{name}' must not be empty", param=name)
    return value


def opt_str_or_list(body: dict[str, Any], name: str, *, max_items: int, max_len: int) -> list[str] | None:
    """OpenAI's `stop`: a string or a list of strings; always returned as a list."""
    value = body.get(name)
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise _type_error(name, "a string or a list of strings")
    if len(items) > max_items:
        raise bad_request(f"'{name}' has more than {max_items} entries", param=name)
    if any(not s or len(s) > max_len for s in items):
        raise bad_request(f"each '{name}' entry must be 1 to {max_len} characters", param=name)
    return items


def token_ids(value: Any, name: str, vocab_size: int | None, *, allow_empty: bool = False) -> list[int]:
    if not isinstance(value, list) or not all(is_int(t) for t in value):
        raise _type_error(name, "a list of integer token ids")
    if not value and not allow_empty:
        raise bad_request(f"'{name}' must not be empty", param=name)
    limit = vocab_size if vocab_size is not None else 2**31
    if any(t < 0 or t >= limit for t in value):
        raise bad_request(f"'{name}' holds a token id outside [0, {limit})", param=name)
    return value


def opt_logit_bias(body: dict[str, Any], name: str, vocab_size: int | None, *, max_items: int) -> dict[str, float] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _type_error(name, "an object mapping token ids to numbers")
    if len(value) > max_items:
        raise bad_request(f"'{name}' has more than {max_items} entries", param=name)
    limit = vocab_size if vocab_size is not None else 2**31
    out: dict[str, float] = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise bad_request(f"'{name}' keys must be token ids", param=name) from None
        if not 0 <= token < limit:
            raise bad_request(f"'{name}' holds a token id outside [0, {limit})", param=name)
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not abs(bias) <= MAX_LOGIT_BIAS_VALUE:
            raise bad_request(f"'{name}' values must be numbers between -{MAX_LOGIT_BIAS_VALUE:g} and "
                              f"{MAX_LOGIT_BIAS_VALUE:g}", param=name)
        out[str(token)] = float(bias)
    return out
