"""Weight-only int8/int4 layers compute x @ W.T of their dequantized weights; the engine runs with them."""
from __future__ import annotations

import random

import pytest
import torch

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.engine.config import EngineConfig
from kvserve.backend.models import grid_weights
from kvserve.backend.models.quantize import Int4Linear, Int8Linear, quantize_model
from kvserve.kernels import cpu_native
from tests.conftest import tiny_model
from tests.kernels.int8_dot_reference import int8_dot_reference


def _bf16_matmul(x, w):
    return x.to(torch.bfloat16).float() @ w.t()


def test_int8_linear_is_the_matmul_of_its_dequantized_weight():
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=gen), torch.randn(96, generator=gen)
    layer = Int8Linear(w, b)
    deq = layer.dequantized()
    # Per channel, rounding moves a weight by at most half a step.
    assert ((deq - w).abs() <= layer.scales.float()[:, None] / 2 + 1e-6).all()
    x = torch.randn(2, 5, 64, generator=gen)
    y = layer(x)
    assert y.shape == (2, 5, 96) and y.dtype == torch.float32
    torch.testing.assert_close(y, _bf16_matmul(x, deq) + b, atol=0.05, rtol=0.02)


def test_int4_linear_is_exact_on_a_weight_it_can_represent():
    """Groups of 32 whose values are lo + k * step (k in 0..15), lo and step exact in bfloat16:
    int4 stores them exactly, so the product is x @ W.T (up to bfloat16 activations on torch's
    kernel; the native ones keep float32). A wrong zero-point convention or group layout would be
    off by whole steps."""
    gen = torch.Generator().manual_seed(1)
    out_f, in_f = 48, 128
    codes = torch.randint(0, 16, (out_f, in_f), generator=gen)
    codes[:, ::32], codes[:, 1::32] = 0, 15  # every group spans the whole code range
    step = torch.tensor([0.25, 0.125, 0.5, 0.0625]).repeat(out_f * in_f // 32 // 4).view(out_f, in_f // 32, 1)
    lo = -(torch.arange(out_f * in_f // 32) % 5).float().view(out_f, in_f // 32, 1)
    w = (lo + codes.view(out_f, in_f // 32, 32) * step).view(out_f, in_f)
    layer = Int4Linear(w, None)
    x = torch.randn(6, in_f, generator=gen)
    if layer.strips is None:
        torch.testing.assert_close(layer(x[:3]), _bf16_matmul(x[:3], w), atol=0.05, rtol=0.01)
        return
    for rows in (3, 6):  # the strips; from 5 rows the tiles, unless the strips take int8 activations
        if layer.strip_kind == grid_weights.Q4_Q8:  # the weight lies on a Q4 grid: its own codes, int8 activations
            want = int8_dot_reference(x[:rows], codes, step.view(out_f, -1), lo.view(out_f, -1), offset=0)
            torch.testing.assert_close(layer(x[:rows]).double(), want, atol=1e-4, rtol=1e-5)
        elif layer.strip_kind == grid_weights.INT4_Q8:  # then the strips take every row: the kernel's arithmetic
            want = int8_dot_reference(x[:rows], codes, step.view(out_f, -1), (lo + 8 * step).view(out_f, -1))
            torch.testing.assert_close(layer(x[:rows]).double(), want, atol=1e-4, rtol=1e-5)
        else:
            torch.testing.assert_close(layer(x[:rows]), x[:rows] @ w.T, atol=1e-4, rtol=1e-5)


@pytest.mark.skipif(cpu_native.pack_linear(torch.zeros(1, 1)) is None, reason="no native CPU kernels here")
def test_int4_strips_and_tiles_read_the_same_weights(monkeypatch):
    # Up to 4 rows the int4 codes go through the grid kernel's strips, from 5 the int4 tiles: one-hot
    # rows read single weights out of each, and they must be the same float32 values. The strips
    # with float32 activations (INT4): the int8 ones round even a one-hot row's scale.
    monkeypatch.setenv("KVSERVE_CPU_INT8_DOT", "0")
    gen = torch.Generator().manual_seed(2)
    layer = Int4Linear(torch.randn(48, 96, generator=gen) * 0.05, torch.randn(48, generator=gen))
    assert layer.strip_kind == grid_weights.INT4
    eye = torch.eye(96)
    for rows in range(1, 9):
        picks = eye[torch.randperm(96, generator=gen)[:rows]]
        tiles = cpu_native.linear_i4(picks, layer.native, 48, None)
        strips = cpu_native.grid_linear_strips(picks, layer.strips, layer.strip_kind, 48, None)
        assert torch.equal(strips, tiles)
        x = torch.randn(rows, 96, generator=gen)
        torch.testing.assert_close(layer(x), cpu_native.linear_i4(x, layer.native, 48, layer.bias),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(cpu_native.pack_linear(torch.zeros(1, 1)) is None, reason="no native CPU kernels here")
def test_int4_keeps_one_copy_of_its_codes_and_takes_any_activation_dtype():
    gen = torch.Generator().manual_seed(3)
    layer = Int4Linear(torch.randn(40, 64, generator=gen) * 0.05, torch.randn(40, generator=gen).bfloat16())
    assert layer.strips is not None and layer.packed is None and layer.scales_and_zeros is None
    x = torch.randn(2, 3, 64, generator=gen)
    want = layer(x)
    assert want.shape == (2, 3, 40) and want.dtype == torch.float32
    # bfloat16 rows go through the same kernel (widened exactly), their result rounded back.
    got = layer(x.bfloat16())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, layer(x.bfloat16().float()).bfloat16(), atol=0, rtol=0)
    # Without the native kernels (another group size here) torch's int4 copy is kept and runs.
    other = Int4Linear(torch.randn(16, 128, generator=gen), None, group_size=64)
    assert other.strips is None and other.packed is not None
    assert other(torch.randn(3, 128, generator=gen)).shape == (3, 16)


def test_int4_needs_group_divisible_inputs():
    with pytest.raises(ValueError, match="quantization: int4 needs input sizes divisible by 32"):
        Int4Linear(torch.randn(8, 40), None)


def test_config_refuses_unknown_modes_and_non_cpu_devices(llama_dir):
    with pytest.raises(ValueError, match="quantization: must be one of"):
        EngineConfig(model=llama_dir, quantization="fp8")
    with pytest.raises(ValueError, match="quantization: 'int8' uses torch's CPU kernels"):
        quantize_model(torch.nn.Module(), "int8", torch.device("cuda"))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # untied lm_head; tied embedding with qkv bias
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_engine_with_quantized_weights_mostly_agrees_with_float(arch, mode):
    model_dir = tiny_model(arch)
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 500) for _ in range(n)] for n in (4, 9, 17, 30, 45, 60)]
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    ref = [o.outputs[0].token_ids for o in LLM(model=model_dir, dtype="float32").generate(prompts, params)]
    llm = LLM(model=model_dir, dtype="float32", quantization=mode)
    layer = llm.engine.runner.model.layers[0]
    assert isinstance(layer.qkv_proj, Int8Linear if mode == "int8" else Int4Linear)
    assert llm.engine.runner.model.logits_proj is not None
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert all(len(g) == 4 for g in got)
    first_agree = sum(g[0] == r[0] for g, r in zip(got, ref))
    assert first_agree >= 4, (got, ref)
