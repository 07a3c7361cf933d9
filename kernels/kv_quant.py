"""The KV cache's element formats: the dtype of each `--kv-cache-dtype`, quantize on write, move bytes.

fp8 caches keep one byte per value, a quarter of float32's, so the same memory holds four times the
tokens and a decode step reads a quarter of the bytes:

    fp8_e4m3 (vLLM's `fp8`)  torch.float8_e4m3fn  1 sign, 4 exponent, 3 mantissa bits  range +-448
    fp8_e5m2                 torch.float8_e5m2    1 sign, 5 exponent, 2 mantissa bits  range +-57344

The scale is per tensor and 1.0 (vLLM's default k_scale = v_scale = 1.0), so a cached value is the
fp8 number nearest the float (round to nearest even). No scale is kept because a floating-point
format's relative error is the same over its whole normal range: a scale only moves the range, and
the keys and values of the models served here lie well inside e4m3's (SmolLM2-135M's largest |K|
and |V| over the accuracy study were 21.6 and 19.5: docs/serving-flags.md). Values beyond the range are clamped to the largest finite
value, as vLLM's kernels saturate: torch's conversion turns them into inf (e5m2) or, on some torch
versions and devices, NaN (e4m3fn has no infinity; torch 2.13's CPU conversion saturates), and one
such key would poison every score of its row. Dequantizing is exact (every fp8 value is a float32), in
the attention kernels' inner loops: the native CPU kernel widens bytes as it loads them, the Triton
kernels convert each loaded tile, the torch path converts the rows it gathers.

torch's CPU indexing kernels do not all take float8 tensors, so caches are written and gathered
through a uint8 view of the same bytes (`byte_rows`).
"""
from __future__ import annotations

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)

# --kv-cache-dtype -> the cache's torch dtype ("auto", the model's dtype, is the caller's to resolve).
KV_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
}


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def fp8_max(dtype: torch.dtype) -> float:
    """The largest finite value of an fp8 format: where writes are clamped."""
    return float(torch.finfo(dtype).max)


def quantize(x: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """x converted to the cache's dtype: fp8 clamped to its range first, others converted as they are."""
    if is_fp8(cache_dtype):
        limit = fp8_max(cache_dtype)
        return x.clamp(-limit, limit).to(cache_dtype)
    return x.to(cache_dtype)


def byte_rows(t: torch.Tensor) -> torch.Tensor:
    """A float8 tensor as uint8 over the same bytes (for index_copy_ and index_select); others as they are."""
    return t.view(torch.uint8) if is_fp8(t.dtype) else t


def from_byte_rows(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of `byte_rows` for rows gathered from a cache of `dtype`."""
    return t.view(dtype) if is_fp8(dtype) else t


def fp8_values(dtype: torch.dtype) -> torch.Tensor:
    """The 256 float32 values of an fp8 format's codes, in code order (the native kernel's table)."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
