"""kernels/cpu_kv_write.c against kv_quant.quantize, bit for bit: the native decode step writes its
keys and values through it, so a cache it fills must hold the very bytes the layer-by-layer path
would have written (a different rounding would move every later token's attention)."""
from __future__ import annotations

import pytest
import torch

from kvserve.kernels import cpu_native
from kvserve.kernels.kv_quant import quantize

pytestmark = pytest.mark.skipif(not cpu_native.available(), reason="no C compiler: the native kernels are not built")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def _inputs() -> torch.Tensor:
    every_half = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    g = torch.Generator().manual_seed(0)
    # Every magnitude from far below fp8's subnormals to far beyond either format's range.
    scaled = torch.randn(100_000, generator=g) * torch.exp2(torch.randint(-30, 20, (100_000,), generator=g).float())
    edges = torch.tensor([0.0, -0.0, 448.0, -448.0, 464.0, 480.0, 57344.0, 61440.0, 1e30, -1e30,
                          2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -16, 2.0 ** -17, 2.0 ** -6, 2.0 ** -14])
    x = torch.cat([every_half, scaled, edges])
    return x[~x.isnan()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2])
def test_native_kv_write_equals_quantize_bit_for_bit(dtype):
    x = _inputs()
    native, reference = cpu_native.kv_from_f32(x, dtype), quantize(x, dtype)
    mismatched = (_bits(native) != _bits(reference)).nonzero().squeeze(1)
    assert mismatched.numel() == 0, f"first mismatches at {x[mismatched[:5]].tolist()}"


def test_nan_is_written_as_nan():
    for dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        assert cpu_native.kv_from_f32(torch.tensor([float("nan")]), dtype).float().isnan().all()
