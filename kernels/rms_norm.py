"""RMSNorm with an optional fused residual add (the decoder's pre-norm pattern)."""
from __future__ import annotations

import torch

from kvserve.kernels._triton_utils import check, check_launch, jit, next_pow2, tl


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


# --------------------------------------------------------------------------- Triton


@jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    stride_x, stride_r, stride_o, stride_ro,
    n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    """One program per row. Rounds where the reference rounds: x + residual to
    x's dtype, the normalised row to x's dtype, the weight product to out's."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * stride_ro + cols, x, mask=mask)
    h = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, 0) / n_cols + eps)
    normed = (h * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


def _launch_rms_norm(x, weight, eps, residual, out, residual_out) -> None:
    rows, n = x.shape
    check(weight.shape == (n,) and weight.stride(0) == 1, f"weight must be [{n}] contiguous")
    check(out.shape == x.shape, "out must match x's shape")
    check(x.stride(-1) == 1 and out.stride(-1) == 1, "x and out need contiguous rows")
    tensors = [x, weight, out]
    if residual is not None:
        check(residual.shape == x.shape and residual.stride(-1) == 1, "residual must match x with contiguous rows")
        check(residual_out.shape == x.shape and residual_out.stride(-1) == 1 and residual_out.dtype == x.dtype,
              "residual_out must match x")
        tensors += [residual, residual_out]
    check_launch(_rms_norm_kernel, *tensors)
    block = next_pow2(n)
    _rms_norm_kernel[(rows,)](
        x, residual if residual is not None else x, weight, out,
        residual_out if residual is not None else out,
        x.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0),
        residual_out.stride(0) if residual is not None else 0,
        n, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block,
        num_warps=min(16, max(1, block // 256)),
    )


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None, *,
                    out: torch.Tensor | None = None, residual_out: torch.Tensor | None = None):
    """Triton version of `rms_norm_torch`: norm(x), or (norm(x + residual), x + residual).

    `out` / `residual_out` may be given (residual_out may be `residual` itself:
    each row is read before it is written).
    """
    shape = x.shape
    n = shape[-1]
    out_dtype = torch.result_type(weight, x)
    x2 = x.reshape(-1, n)
    if out is None:
        out = torch.empty(shape, dtype=out_dtype, device=x.device)
    check(out.dtype == out_dtype, f"out must be {out_dtype}")
    out2 = out.view(-1, n)
    res2 = res_out2 = None
    if residual is not None:
        check(residual.dtype == x.dtype, "residual must have x's dtype")
        res2 = residual.reshape(-1, n)
        if residual_out is None:
            residual_out = torch.empty(shape, dtype=x.dtype, device=x.device)
        res_out2 = residual_out.view(-1, n)
    if x2.shape[0] > 0:
        _launch_rms_norm(x2, weight, eps, res2, out2, res_out2)
    return out if residual is None else (out, residual_out)
