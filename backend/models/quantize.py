"""Weight-only quantization on the CPU through torch's own kernels (`--quantization int8|int4`).

A decode step reads every weight once, so at small batches its time is the
weights' bytes over the memory bandwidth: int8 weights are a quarter of fp32's
bytes and int4 an eighth. Applied after loading, whatever the loader (the
linear layers and the logits projection are replaced; the embedding table
stays as loaded, since a step reads only the rows of its tokens).

- int8: symmetric, one scale per output channel. On the CPU with AVX-512 (or AVX2 + FMA) the
  native kernel of kernels/cpu_linear.c runs it on float32 activations (1.2x
  torch's kernel at 1 row, 1.7x at 16, 1.4x at 1,024: loadtests/studies/cpu_kernels/linear_ab.py
  --int8); elsewhere `aten._weight_int8pack_mm`.
- int4: asymmetric in groups of 32 along the input dimension (GGUF's Q4 block
  size), the tinygemm convention w = (q - 8) * scale + zero. With AVX-512 BW or AVX2
  the grid kernel's strips run it at every row count on activations rounded to int8 per
  block of 32 (kernels/cpu_grid_int8_dot.c, 1.5-2x torch's kernel from 1 to 128 rows
  on AVX-512, 1.9-3.9x on AVX2); with KVSERVE_CPU_INT8_DOT=0, from 5 rows up the native
  tile kernel on float32 activations (1.45x torch's at 8 rows, 1.4x at 16, 1.2x at
  1,024), up to 4 rows the float32 strips over the same codes; machines without
  either take `aten._weight_int4pack_mm_for_cpu`.

Torch's kernels are fast only with bfloat16 activations (with float32 ones torch
falls back to a loop ~50x slower than an fp32 matmul), so activations are cast
to bfloat16 at each quantized layer and the result cast back: that rounding is
part of the modes' accuracy cost (loadtests/studies/quant_accuracy.py measures it).
"""
from __future__ import annotations

import os

import torch
from torch import nn

from kvserve.backend.models import gguf_codes, grid_weights
from kvserve.backend.models.cpu_linear import CodedEmbedding, PackedLinear
from kvserve.kernels import cpu_native

QUANTIZATION_MODES = ("none", "int8", "int4")
INT4_GROUP_SIZE = 32
_ACT_DTYPE = torch.bfloat16


def _strips_kind() -> int:
    """The int4 strips' kind: where the machine has the int8 dot kernel (AVX-512 BW, or AVX2 + FMA +
    F16C), INT4_Q8, which multiplies the codes with activations quantized to int8 per block of 32, as
    llama.cpp's Q4 x Q8 dot does (kernels/cpu_grid_int8_dot.c), and then serves every row count; else
    INT4, float32 activations, up to 4 rows (the tiles take more). One step's projections on
    SmolLM2's shapes (`linear_ab.py --int4`, 2 threads), ms, float32 strips / tiles / int8 strips:
    - Zen 4 (AVX-512): 1 row 5.1 / 7.2 / 3.5, 4 rows 9.4 / 9.8 / 6.9, 16 rows 31.2 / 27.0 / 19.8,
      64 rows 126 / 101 / 73, 128 rows 245 / 198 / 145;
    - Zen 3 (AVX2): 1 row 9.2 / 15.5 / 3.9, 4 rows 15.7 / 19.9 / 8.8, 16 rows 55.4 / 42.2 / 29.4,
      64 rows 217 / 163 / 111, 128 rows 420 / 402 / 224.
    KVSERVE_CPU_INT8_DOT=0 keeps INT4 (A/B measurements)."""
    if os.environ.get("KVSERVE_CPU_INT8_DOT", "1") != "0" and cpu_native.int8_dot_available():
        return grid_weights.INT4_Q8
    return grid_weights.INT4


class Int8Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        w = weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        # Round with the scale the kernel will use (it takes bfloat16 scales).
        scale = scale.to(_ACT_DTYPE)
        self.register_buffer("weight", (w / scale.float()[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.out_features, self.in_features = weight.shape
        # The native kernel's copy of the codes (None without it) and its float32 scales (the same values).
        self.native = cpu_native.pack_linear(self.weight)
        self.native_scales = scale.float().contiguous()

    def dequantized(self) -> torch.Tensor:
        return self.weight.float() * self.scales.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None and x.dim() == 2 and x.dtype == torch.float32:
            y = cpu_native.linear(x, self.native, self.out_features, self.bias, self.native_scales)
            if y is not None:
                return y
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, self.in_features).to(_ACT_DTYPE), self.weight,
                                               self.scales)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def _int4_codes(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """int4's rounding of `weight` [N, K]: codes [N, K] (int32, 0..15) and the scale and zero [N, K / group]
    of each group, bfloat16 values, with w ~ (q - 8) * scale + zero."""
    out_features, in_features = weight.shape
    w = weight.detach().float().view(out_features, in_features // group_size, group_size)
    lo, hi = w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-8).to(_ACT_DTYPE).float()
    zero = (lo + 8 * scale).to(_ACT_DTYPE).float()
    # Codes from the rounded scale and zero: q = (w - zero) / scale + 8.
    q = ((w - zero) / scale + 8).round().clamp(0, 15).to(torch.int32).view(out_features, in_features)
    return q, scale.squeeze(-1), zero.squeeze(-1)


class Int4Linear(nn.Module):

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group_size: int = INT4_GROUP_SIZE,
                 grid: grid_weights.GridWeight | None = None) -> None:
        super().__init__()
        out_features, in_features = weight.shape
        if in_features % group_size:
            raise ValueError(f"quantization: int4 needs input sizes divisible by {group_size}, "
                             f"a layer has {in_features}")
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.group_size = group_size
        self.out_features, self.in_features = out_features, in_features
        native_group = group_size == cpu_native.INT4_GROUP
        self.strip_kind = _strips_kind()
        # With int8 activations the strips serve every row count (faster than the tiles from 1 to 128
        # rows: _strips_kind), so the tiles are not kept as well.
        int8_activations = native_group and self.strip_kind == grid_weights.INT4_Q8
        # `grid`: the weight's own codes on GGUF's grids (int4_linear), kept for the strips instead of
        # int4's own rounding, which is then not computed.
        # `self.grid`: those codes as their grid, where the strips are its (a tied table's lookup reads
        # them: CodedEmbedding).
        self.grid = self.native = None
        # With float32 activations, from this many rows the int4 tiles of cpu_linear.c; fewer, the same
        # codes in cpu_grid_linear.c's strips, as for the grid codes (past the rows one call of the strips
        # widens each code for). One step's projections on SmolLM2's shapes, ms, torch's int4 kernel / the
        # tiles / the strips (linear_ab.py --int4, Zen 4 with AVX-512, 2 threads): 1 row 7.4 / 9.7 / 5.5,
        # 2 rows 8.4 / 10.3 / 6.6, 4 rows 10.3 / 10.9 / 9.9, 6 rows 17.5 / 12.8 / 15.5.
        self.native_min_rows = cpu_native.grid_strip_rows() + 1
        packed = scales_and_zeros = None
        if grid is not None and int8_activations and grid.kind in _WITH_INT8_ACTIVATIONS:
            halves = grid_weights.q4_strips_f16(grid) if grid.kind == grid_weights.Q4 else None
            if halves is not None:  # float16 constants (Q4_1's): fewer bytes, the same values
                self.strips, self.strip_kind = halves, grid_weights.Q4H_Q8
            else:
                self.grid = grid._replace(tiles=None)  # the grid kernels' tiles are not read here
                self.strips, self.strip_kind = grid.strips, _WITH_INT8_ACTIVATIONS[grid.kind]
        else:
            q, scale, zero = _int4_codes(weight, group_size)
            # The native tiles (None without them, or for another group size): the same codes, scales
            # and zeros, so they compute the same dequantized weight.
            self.native = (cpu_native.pack_linear_i4(q, scale, zero)
                           if native_group and not int8_activations else None)
            # int4's codes in the grid kernel's strips: with int8 activations for every row count; with
            # float32 ones below native_min_rows (a row of a decode step, a speculative step's few
            # rows), where the tiles' unpacking is not shared by enough rows.
            self.strips = (grid_weights.int4_strips(q, scale, zero, self.strip_kind)
                           if int8_activations or self.native is not None else None)
            # torch's own int4 copy only where no native kernel holds the weight (no C compiler or vector
            # unit, another group size): with one, every activation dtype goes through it, and the weight
            # is in memory once (both: 80 MiB more RSS for SmolLM2-135M, 159 MiB for Gemma 3 270M).
            if self.strips is None:
                packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
                # [in / group, out, 2]: (scale, zero) of each group, as the kernel takes them.
                scales_and_zeros = torch.stack((scale, zero), dim=-1).transpose(0, 1).contiguous().to(_ACT_DTYPE)
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.strips is None:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, self.in_features).to(_ACT_DTYPE),
                                                           self.packed, self.group_size, self.scales_and_zeros)
            y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
            return y if self.bias is None else y + self.bias
        # The native kernels take contiguous float32 rows (no copy where x is such already).
        rows = x.reshape(-1, self.in_features).float().contiguous()
        bias = None if self.bias is None else self.bias.float()
        if self.native is not None and rows.shape[0] >= self.native_min_rows:
            y = cpu_native.linear_i4(rows, self.native, self.out_features, bias)
        else:
            y = cpu_native.grid_linear_strips(rows, self.strips, self.strip_kind, self.out_features, bias)
        if y is None:  # the kernels decline only without memory for their scratch
            raise RuntimeError("quantization: the native int4 kernel could not run (out of memory?)")
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)


_LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


# The grid kinds whose strips the int8 dot kernel reads as they are, and the kind it reads them as.
_WITH_INT8_ACTIVATIONS = {grid_weights.Q4: grid_weights.Q4_Q8, grid_weights.Q8: grid_weights.Q8_Q8,
                          grid_weights.Q8_HALVES: grid_weights.Q8H_Q8}


def int4_linear(weight: torch.Tensor, bias: torch.Tensor | None, few_rows: bool = False,
                codes: gguf_codes.BlockCodes | None = None) -> nn.Module:
    """`--quantization int4`'s layer for `weight`. A weight that a GGUF file quantized already (its
    float32 values on one of GGUF's block grids: grid_weights.py) keeps its own codes, exact, as
    llama.cpp runs a file's own types: on the int8-activation strips (Int4Linear's Q4_Q8 and Q4H_Q8
    for Q4's grids, Q8_Q8 for Q8's, Q8H_Q8 for Q8_HALVES': Q5_1, Q5_K, Q6_K), or where those strips do
    not run, on the grid kernels as without --quantization (cpu_linear.PackedLinear; `few_rows`: the
    logits projection). Rounding them to int4 again moved
    SmolLM2's Q4_1 file far more than int8 activations do: +3.5 % perplexity from its Q8_0 logits
    projection alone, against +0.5 % from the int8 activations of its layers (BENCHMARKS.md §7,
    nineteenth point). Other weights are rounded to int4. `codes`: the blocks the loader read for
    this weight (a GGUF file), else its grid is searched for (a folder made from one)."""
    grid = None
    if cpu_native.linear_available() and os.environ.get("KVSERVE_CPU_GRID", "1") != "0":
        grid = (grid_weights.from_codes(codes, weight) if codes is not None else None) or grid_weights.find_grid(weight)
    if grid is None:
        return Int4Linear(weight, bias)
    if grid.kind in _WITH_INT8_ACTIVATIONS and _strips_kind() == grid_weights.INT4_Q8:
        return Int4Linear(weight, bias, grid=grid)
    return PackedLinear(weight, bias, few_rows=few_rows, grid=grid)


def _quantized(mode: str, weight: torch.Tensor, bias: torch.Tensor | None, few_rows: bool = False,
               codes: gguf_codes.BlockCodes | None = None) -> nn.Module:
    return Int8Linear(weight, bias) if mode == "int8" else int4_linear(weight, bias, few_rows, codes)


def quantize_model(model: nn.Module, mode: str, device: torch.device,
                   block_codes: dict[str, gguf_codes.BlockCodes] | None = None) -> nn.Module:
    """Replace the decoder's linear layers and its logits projection with `mode`'s; returns the model.
    `block_codes`: the GGUF codes the loader read, by parameter name (consumed; int4 keeps them)."""
    if mode not in QUANTIZATION_MODES:
        raise ValueError(f"quantization: must be one of {QUANTIZATION_MODES}, got {mode!r}")
    if mode == "none":
        return model
    if device.type != "cpu":
        raise ValueError(f"quantization: {mode!r} uses torch's CPU kernels; it is not available on {device.type}")
    codes = block_codes if block_codes is not None else {}
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            for name in _LINEARS:
                linear = getattr(layer, name)
                setattr(layer, name, _quantized(mode, linear.weight, linear.bias,
                                                codes=codes.pop(f"layers.{i}.{name}.weight", None)))
        tied = model.lm_head is None
        weight = model.embed_tokens.weight if tied else model.lm_head
        model.logits_proj = _quantized(mode, weight, None, few_rows=True,
                                       codes=codes.pop("embed_tokens.weight" if tied else "lm_head", None))
        grid = getattr(model.logits_proj, "grid", None)
        if tied and grid is not None:  # a tied table kept as its codes serves the lookup too, as unquantized
            model.embed_tokens = CodedEmbedding(grid)
        codes.clear()
        if model.lm_head is not None:  # untied: the float copy is never read again
            model.lm_head = None
    return model
