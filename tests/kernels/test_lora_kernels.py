"""The batched LoRA products (kernels/lora_sgmv.py): the native C kernel and the Triton kernels
(under the interpreter without a GPU) against the torch reference, on random groups of rows
with mixed ranks, slots without rows, rows without adapters and an output column offset."""
from __future__ import annotations

import pytest
import torch

from kvserve.kernels import cpu_native
from kvserve.kernels.lora_sgmv import lora_torch, lora_triton


def _case(seed: int, rows: int, k: int, n: int, slots: int, r_max: int, ranks: list[int]):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen)
    a = torch.randn(slots, r_max, k, generator=gen)
    bt = torch.randn(slots, r_max, n, generator=gen)
    for s, r in enumerate(ranks):  # the slots' padding rows are zero, as LoRASlots keeps them
        a[s, r:], bt[s, r:] = 0, 0
    scales = torch.rand(slots, generator=gen) + 0.5
    slot_of = torch.randint(-1, slots, (rows,), generator=gen)  # -1: the row runs no adapter
    order, starts, group_slots = [], [0], []
    for s in range(slots):
        members = (slot_of == s).nonzero().flatten().tolist()
        if members and ranks[s]:
            order += members
            starts.append(len(order))
            group_slots.append(s)
    y = torch.randn(rows, n + 7, generator=gen)
    return x, y, a, bt, scales, ranks, torch.tensor(order, dtype=torch.int64), starts, group_slots


CASES = [(0, 37, 96, 80, 3, 16, [16, 8, 4]), (1, 5, 64, 200, 4, 8, [8, 0, 8, 2]), (2, 64, 576, 192, 2, 16, [16, 16])]


def _reference(case):
    x, y, a, bt, scales, ranks, order, starts, slots = case
    want = y.clone()
    lora_torch(x.double(), want, a.double(), bt.double(), scales.double(), ranks, order, starts, slots, 3)
    return want


@pytest.mark.parametrize("params", CASES)
def test_torch_reference_is_one_product_per_row(params) -> None:
    x, y, a, bt, scales, ranks, order, starts, slots = case = _case(*params)
    got = y.clone()
    lora_torch(x, got, a, bt, scales, ranks, order, starts, slots, 3)
    want = y.clone()
    for g, s in enumerate(slots):
        for row in order[starts[g]:starts[g + 1]].tolist():
            want[row, 3:3 + bt.shape[2]] += scales[s] * (x[row] @ a[s].T @ bt[s])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
    untouched = sorted(set(range(x.shape[0])) - set(order.tolist()))
    assert torch.equal(got[untouched], y[untouched]) and not torch.equal(got, y)
    torch.testing.assert_close(got, _reference(case).float(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("params", CASES)
def test_native_kernel_matches_reference(params) -> None:
    if not cpu_native.available():
        pytest.skip("no C compiler: the native kernels are not built")
    x, y, a, bt, scales, ranks, order, starts, slots = case = _case(*params)
    got = y.clone()
    assert cpu_native.lora(x, got, a, bt, scales, torch.tensor(ranks), order, torch.tensor(starts),
                           torch.tensor(slots, dtype=torch.int64), 3)
    torch.testing.assert_close(got, _reference(case).float(), rtol=1e-4, atol=1e-3)
    assert torch.equal(got[:, :3], y[:, :3]) and torch.equal(got[:, 3 + bt.shape[2]:], y[:, 3 + bt.shape[2]:])


def test_native_kernel_declines_other_dtypes() -> None:
    x, y, a, bt, scales, ranks, order, starts, slots = _case(*CASES[0])
    assert not cpu_native.lora(x.bfloat16(), y.bfloat16(), a.bfloat16(), bt.bfloat16(), scales, torch.tensor(ranks),
                               order, torch.tensor(starts), torch.tensor(slots, dtype=torch.int64), 3)


@pytest.mark.parametrize("params", CASES[:2])
def test_triton_kernels_match_reference(params, device) -> None:
    x, y, a, bt, scales, ranks, order, starts, slots = case = _case(*params)
    row_slots = torch.tensor([s for g, s in enumerate(slots) for _ in range(starts[g + 1] - starts[g])],
                             dtype=torch.int64)
    got = y.clone().to(device)
    lora_triton(x.to(device), got, a.to(device), bt.to(device), scales.to(device),
                torch.tensor(ranks, dtype=torch.int64, device=device), order.to(device), row_slots.to(device), 3)
    torch.testing.assert_close(got.cpu(), _reference(case).float(), rtol=1e-4, atol=1e-3)
