"""Batched LoRA products over a step's rows, grouped by adapter slot (punica / S-LoRA style).

For one projection target, every row m of the flat batch that runs an adapter gets

    y[m, y_off:y_off + N] += scale[s] * (x[m] @ A[s, :rank[s]].T) @ Bt[s, :rank[s]]

where s is the row's slot. The rows come grouped by slot (`order` lists row indices, group g
owns order[group_starts[g]:group_starts[g + 1]] and uses slot group_slots[g]), so each adapter's
A and B are read once per step for all its rows, whatever the requests' order in the batch:

    A  [S, R, K]   slot s's down-projection, rank rows past rank[s] are zero
    Bt [S, R, N]   slot s's up-projection, transposed so a row of it is N contiguous outputs
    t  [M, R]      the shrink's result: row order[i] of x times A[slot]^T (the expand reads it)

The shrink (x -> t) and the expand (t -> y) are the two kernels; rows without an adapter are in
no group and are not touched. Here: the torch reference and the Triton kernels (CUDA; tested
under TRITON_INTERPRET=1). The CPU's native kernel is kernels/cpu_lora.c via cpu_native.lora.
"""
from __future__ import annotations

import torch

from kvserve.kernels._triton_utils import check, check_launch, jit, next_pow2, tl


def lora_torch(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, bt: torch.Tensor, scales: torch.Tensor,
               ranks: list[int], order: torch.Tensor, group_starts: list[int], group_slots: list[int],
               y_off: int) -> None:
    """The reference, in place on y: one matmul pair per adapter group (not per request), in float32."""
    n = bt.shape[2]
    for g, slot in enumerate(group_slots):
        rows = order[group_starts[g]:group_starts[g + 1]]
        r = ranks[slot]
        if rows.numel() == 0 or r == 0:
            continue
        t = x[rows].float() @ a[slot, :r].float().T
        delta = (t @ bt[slot, :r].float()) * float(scales[slot])
        y[rows, y_off:y_off + n] += delta.to(y.dtype)


# --------------------------------------------------------------------------- Triton


@jit
def _lora_shrink_kernel(x_ptr, a_ptr, t_ptr, order_ptr, row_slot_ptr, ranks_ptr,
                        stride_x, stride_as, stride_ar, stride_t, K,
                        BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program per grouped row: t[i, :] = x[order[i]] @ A[slot]^T over the slot's rank."""
    i = tl.program_id(0).to(tl.int64)
    row = tl.load(order_ptr + i).to(tl.int64)
    slot = tl.load(row_slot_ptr + i).to(tl.int64)
    rank = tl.load(ranks_ptr + slot)
    rs = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        xk = tl.load(x_ptr + row * stride_x + ks, mask=ks < K, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + slot * stride_as + rs[:, None] * stride_ar + ks[None, :],
                    mask=(rs[:, None] < rank) & (ks[None, :] < K), other=0.0).to(tl.float32)
        acc += tl.sum(a * xk[None, :], 1)
    tl.store(t_ptr + i * stride_t + rs, acc, mask=rs < rank)


@jit
def _lora_expand_kernel(t_ptr, bt_ptr, y_ptr, order_ptr, row_slot_ptr, ranks_ptr, scales_ptr,
                        stride_t, stride_bs, stride_br, stride_y, y_off, N,
                        BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program (i, j): y[order[i], y_off + j-th block of N] += scale * t[i] @ Bt[slot]."""
    i = tl.program_id(0).to(tl.int64)
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row = tl.load(order_ptr + i).to(tl.int64)
    slot = tl.load(row_slot_ptr + i).to(tl.int64)
    rank = tl.load(ranks_ptr + slot)
    scale = tl.load(scales_ptr + slot).to(tl.float32)
    rs = tl.arange(0, BLOCK_R)
    t = tl.load(t_ptr + i * stride_t + rs, mask=rs < rank, other=0.0)
    b = tl.load(bt_ptr + slot * stride_bs + rs[:, None] * stride_br + ns[None, :],
                mask=(rs[:, None] < rank) & (ns[None, :] < N), other=0.0).to(tl.float32)
    delta = tl.sum(b * t[:, None], 0) * scale
    ptrs = y_ptr + row * stride_y + y_off + ns
    y = tl.load(ptrs, mask=ns < N, other=0.0).to(tl.float32)
    tl.store(ptrs, (y + delta).to(y_ptr.dtype.element_ty), mask=ns < N)


def _launch(x, y, a, bt, scales, ranks, order, row_slots, y_off) -> None:
    m = order.shape[0]
    slots, r_max, k = a.shape
    n = bt.shape[2]
    check(x.dim() == 2 and x.shape[1] == k and x.stride(1) == 1, f"x must be [T, {k}] with contiguous rows")
    check(y.dim() == 2 and y.stride(1) == 1 and 0 <= y_off and y_off + n <= y.shape[1], "y too narrow for y_off + N")
    check(a.is_contiguous() and bt.is_contiguous() and bt.shape[:2] == (slots, r_max), "A [S, R, K], Bt [S, R, N]")
    check(scales.shape == (slots,) and ranks.shape == (slots,), "scales and ranks need one value per slot")
    check(row_slots.shape == (m,) and order.dtype == torch.int64 and row_slots.dtype == torch.int64,
          "order and row_slots: int64 [M]")
    check_launch(_lora_shrink_kernel, x, a, y, bt, order, row_slots, ranks, scales)
    block_r = max(16, next_pow2(r_max))
    t = torch.empty(m, block_r, dtype=torch.float32, device=x.device)
    _lora_shrink_kernel[(m,)](x, a, t, order, row_slots, ranks, x.stride(0), a.stride(0), a.stride(1), t.stride(0),
                              k, BLOCK_R=block_r, BLOCK_K=64)
    block_n = 64
    _lora_expand_kernel[(m, -(-n // block_n))](t, bt, y, order, row_slots, ranks, scales, t.stride(0), bt.stride(0),
                                               bt.stride(1), y.stride(0), y_off, n, BLOCK_R=block_r,
                                               BLOCK_N=block_n)


def lora_triton(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, bt: torch.Tensor, scales: torch.Tensor,
                ranks: torch.Tensor, order: torch.Tensor, row_slots: torch.Tensor, y_off: int) -> None:
    """`lora_torch`'s product in place on y, with the grouping given per row (`row_slots[i]` is the
    slot of row order[i]) and ranks as an int32 device tensor."""
    if order.numel():
        _launch(x, y, a, bt, scales, ranks, order, row_slots, y_off)
