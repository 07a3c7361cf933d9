"""`--speculative-config`: vLLM's JSON object, checked once at start.

A bad config is refused with a message naming the field (`speculative_config.<key>: ...`),
so a typo never silently turns speculation off. `ngram`, `suffix` and `draft_model` run; as in
vLLM, a `"model"` without a `"method"` means `draft_model`. What needs the draft loaded (its
tokenizer and vocabulary against the target's) is checked when the engine starts
(draft_model.py `check_draft`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METHODS_BUILT = ("ngram", "suffix", "draft_model")
# k beyond this buys nothing on a CPU step and makes every rejected run costlier.
MAX_SPECULATIVE_TOKENS = 16
# kvserve's own key (vLLM has no such switch): "measured" grants proposals per step from the
# measured step cost and acceptance (spec_policy.py); "off" verifies every proposal, as vLLM does.
LOAD_POLICIES = ("measured", "off")
_KEYS = {
    "ngram": ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "load_policy"),
    "suffix": ("method", "num_speculative_tokens", "suffix_decoding_max_tree_depth",
               "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
               "suffix_decoding_min_token_prob", "load_policy"),
    "draft_model": ("method", "model", "num_speculative_tokens", "load_policy"),
}
# vLLM caches 10,000 finished outputs by default; here a tree node is a Python object (~260 bytes,
# and a 200-token output adds up to ~4,800 of them), so the default keeps a few hundred MB at most.
DEFAULT_SUFFIX_CACHED_REQUESTS = 256


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = DEFAULT_SUFFIX_CACHED_REQUESTS
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    load_policy: str = "measured"
    model: str | None = None  # draft_model: the draft's folder or .gguf file


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
    if method is None and value.get("model") is not None:
        method = "draft_model"  # vLLM: a model whose method it cannot detect is a draft model
    built = ", ".join(METHODS_BUILT)
    if method is None:
        raise ValueError(f"speculative_config.method: required (one of: {built})")
    if method not in METHODS_BUILT:
        raise ValueError(f"speculative_config.method: unknown method {method!r} (one of: {built})")
    unknown = sorted(set(value) - set(_KEYS[method]))
    if unknown:
        raise ValueError(f"speculative_config.{unknown[0]}: unknown key for method {method!r} "
                         f"(known: {', '.join(_KEYS[method])})")
    policy = value.get("load_policy", "measured")
    if policy not in LOAD_POLICIES:
        raise ValueError(f"speculative_config.load_policy: must be one of {', '.join(LOAD_POLICIES)}, got {policy!r}")
    if method == "suffix":
        return _suffix_config(value, policy)
    if method == "draft_model":
        return _draft_config(value, policy)
    k = _int_in("num_speculative_tokens", value.get("num_speculative_tokens"), 1, MAX_SPECULATIVE_TOKENS)
    # vLLM's defaults: both 5 when neither is given, else the one missing equals the other.
    lo_raw, hi_raw = value.get("prompt_lookup_min"), value.get("prompt_lookup_max")
    if lo_raw is None and hi_raw is None:
        lo_raw = hi_raw = 5
    lo = _int_in("prompt_lookup_min", hi_raw if lo_raw is None else lo_raw, 1, 64)
    hi = _int_in("prompt_lookup_max", lo_raw if hi_raw is None else hi_raw, 1, 64)
    if hi < lo:
        raise ValueError(f"speculative_config.prompt_lookup_max: {hi} is below prompt_lookup_min ({lo})")
    return SpeculativeConfig(method, k, lo, hi, load_policy=policy)


def _suffix_config(value: dict[str, Any], policy: str) -> SpeculativeConfig:
    depth = _int_in("suffix_decoding_max_tree_depth", value.get("suffix_decoding_max_tree_depth", 24), 2, 64)
    # vLLM's default k for suffix is the tree depth: the guess length is the method's own choice.
    k = _int_in("num_speculative_tokens",
                value.get("num_speculative_tokens", min(depth, MAX_SPECULATIVE_TOKENS)), 1, MAX_SPECULATIVE_TOKENS)
    cached = _int_in("suffix_decoding_max_cached_requests",
                     value.get("suffix_decoding_max_cached_requests", DEFAULT_SUFFIX_CACHED_REQUESTS), 0, 1_000_000)
    factor = _float_in("suffix_decoding_max_spec_factor", value.get("suffix_decoding_max_spec_factor", 1.0),
                       0.0, 64.0, low_open=True)
    prob = _float_in("suffix_decoding_min_token_prob", value.get("suffix_decoding_min_token_prob", 0.1), 0.0, 1.0)
    return SpeculativeConfig("suffix", k, suffix_decoding_max_tree_depth=depth,
                             suffix_decoding_max_cached_requests=cached, suffix_decoding_max_spec_factor=factor,
                             suffix_decoding_min_token_prob=prob, load_policy=policy)


def _draft_config(value: dict[str, Any], policy: str) -> SpeculativeConfig:
    model = value.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError("speculative_config.model: required for draft_model (the draft's folder or .gguf file)")
    path = Path(model)
    if not path.is_dir() and not (path.is_file() and path.suffix == ".gguf"):
        raise ValueError(f"speculative_config.model: {model!r} is neither a model folder nor a .gguf file")
    k = _int_in("num_speculative_tokens", value.get("num_speculative_tokens"), 1, MAX_SPECULATIVE_TOKENS)
    return SpeculativeConfig("draft_model", k, load_policy=policy, model=model)


def _float_in(name: str, value: Any, lo: float, hi: float, low_open: bool = False) -> float:
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (lo < value if low_open else lo <= value) and value <= hi)
    if not ok:
        bounds = f"{'(' if low_open else '['}{lo}, {hi}]"
        raise ValueError(f"speculative_config.{name}: must be a number in {bounds}, got {value!r}")
    return float(value)


def _int_in(name: str, value: Any, lo: int, hi: int) -> int:
    if value is None:
        raise ValueError(f"speculative_config.{name}: required")
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"speculative_config.{name}: must be an integer in [{lo}, {hi}], got {value!r}")
    return value
