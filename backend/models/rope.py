"""Rotary-embedding tables: inverse frequencies for the common rope scaling types.

Returned as a cos/sin cache [max_position, head_dim] (cos half, then sin half)
consumed by kernels/rotary.py. Scaling types: default, linear, dynamic (NTK,
computed for max_position up front), llama3, yarn.
"""
from __future__ import annotations

import math
from typing import Any

import torch


def _default_inv_freq(dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor = s["factor"]
    low, high = s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_ctx = s.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_inv_freq(dim: int, theta: float, s: dict[str, Any], max_pos: int) -> tuple[torch.Tensor, float]:
    factor = s["factor"]
    old_ctx = s.get("original_max_position_embeddings", max_pos)
    beta_fast, beta_slow = s.get("beta_fast", 32), s.get("beta_slow", 1)
    mscale = s.get("attention_factor") or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old_ctx / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = _default_inv_freq(dim, theta)
    interpolation = extrapolation / factor
    keep_extrapolation = 1 - ramp
    return interpolation * (1 - keep_extrapolation) + extrapolation * keep_extrapolation, mscale


def build_cos_sin_cache(head_dim: int, theta: float, max_position: int,
                        scaling: dict[str, Any] | None) -> torch.Tensor:
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    inv_freq = _default_inv_freq(head_dim, theta)
    attention_scale = 1.0
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "dynamic":
        factor = scaling["factor"]
        old_ctx = scaling.get("original_max_position_embeddings", max_position)
        if max_position > old_ctx:
            base = theta * ((factor * max_position / old_ctx) - (factor - 1)) ** (head_dim / (head_dim - 2))
            inv_freq = _default_inv_freq(head_dim, base)
    elif kind == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    elif kind == "yarn":
        inv_freq, attention_scale = _yarn_inv_freq(head_dim, theta, scaling, max_position)
    elif kind != "default":
        raise ValueError(f"model: rope scaling type {kind!r} is not supported")
    t = torch.arange(max_position, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    return torch.cat((freqs.cos() * attention_scale, freqs.sin() * attention_scale), dim=-1)
