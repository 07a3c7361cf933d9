"""`--speculative-config`: vLLM's JSON object, checked once at start.

A bad config is refused with a message naming the field (`speculative_config.<key>: ...`),
so a typo never silently turns speculation off. Only `ngram` runs today; `suffix` and
`draft_model` are vLLM's names for methods issue 32 plans, refused by name until they exist.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

METHODS_BUILT = ("ngram",)
METHODS_PLANNED = ("suffix", "draft_model")
# k beyond this buys nothing on a CPU step and makes every rejected run costlier.
MAX_SPECULATIVE_TOKENS = 16
_NGRAM_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int


def parse_speculative_config(value: dict[str, Any] | str | None) -> SpeculativeConfig | None:
    """None (or an empty object) means no speculation; anything else must be a valid config."""
    if value is None or value == "" or value == {}:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative_config: not a JSON object ({exc.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"speculative_config: must be a JSON object, got {type(value).__name__}")
    method = value.get("method")
    if method is None:
        raise ValueError("speculative_config.method: required (one of: ngram)")
    if method in METHODS_PLANNED:
        raise ValueError(f"speculative_config.method: {method!r} is not built yet (only 'ngram' is)")
    if method not in METHODS_BUILT:
        raise ValueError(f"speculative_config.method: unknown method {method!r} (one of: ngram)")
    unknown = sorted(set(value) - set(_NGRAM_KEYS))
    if unknown:
        raise ValueError(f"speculative_config.{unknown[0]}: unknown key for method 'ngram' "
                         f"(known: {', '.join(_NGRAM_KEYS)})")
    k = _int_in("num_speculative_tokens", value.get("num_speculative_tokens"), 1, MAX_SPECULATIVE_TOKENS)
    # vLLM's defaults: both 5 when neither is given, else the one missing equals the other.
    lo_raw, hi_raw = value.get("prompt_lookup_min"), value.get("prompt_lookup_max")
    if lo_raw is None and hi_raw is None:
        lo_raw = hi_raw = 5
    lo = _int_in("prompt_lookup_min", hi_raw if lo_raw is None else lo_raw, 1, 64)
    hi = _int_in("prompt_lookup_max", lo_raw if hi_raw is None else hi_raw, 1, 64)
    if hi < lo:
        raise ValueError(f"speculative_config.prompt_lookup_max: {hi} is below prompt_lookup_min ({lo})")
    return SpeculativeConfig(method, k, lo, hi)


def _int_in(name: str, value: Any, lo: int, hi: int) -> int:
    if value is None:
        raise ValueError(f"speculative_config.{name}: required")
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"speculative_config.{name}: must be an integer in [{lo}, {hi}], got {value!r}")
    return value
