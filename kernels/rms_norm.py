"""RMSNorm with an optional fused residual add (the decoder's pre-norm pattern)."""
from __future__ import annotations

import torch


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float,
                   residual: torch.Tensor | None = None):
    """Returns norm(x) or, with a residual, (norm(x + residual), x + residual).

    Computed in float32 like Hugging Face's LlamaRMSNorm, cast back to x's dtype.
    """
    if residual is not None:
        x = x + residual
        residual = x
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * h.to(x.dtype)
    return out if residual is None else (out, residual)
