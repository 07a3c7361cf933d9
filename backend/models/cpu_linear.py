"""float32 linear layers on the CPU: kvserve's native kernels over weights packed once at load,
else oneDNN with weights reordered once at load.

`F.linear` on the CPU calls an sgemm that repacks the weight on every call; at
the few rows of a decode step that is a large part of the work. oneDNN's
`_linear_pointwise` over a weight reordered into its blocked layout once runs
the projections of a 16- or 64-row step ~2.5x faster per core (measured in CPU
time, loadtests/studies/ab_decode.py), and about as fast at one row. The
results differ from sgemm's by float32 rounding only (another summation order).

Where the native kernels of kernels/cpu_linear.c run, the weight is packed for
them instead, and that one copy serves every step: it streams the weight in
memory order with prefetching, 1.3x faster than oneDNN at one row and 1.1x at
64, and 0.93-0.96x oneDNN's speed at 256-1,024 rows of prefill
(loadtests/studies/cpu_kernels/linear_ab.py, Zen 4). Keeping oneDNN's copy for
prefill as well held the weights twice over (538 MB more for SmolLM2); at most a
few percent of a long prompt's projections did not pay for that.
KVSERVE_CPU_NATIVE=0 keeps oneDNN's copy only.

A weight whose float32 values lie on a GGUF block grid (grid_weights.py: a Q4_1 or Q8_0
checkpoint loaded as float32, checked bit for bit) keeps its codes instead of the float32
tiles (a fifth of the bytes, in two layouts), and the decode-sized steps read those: up to 4 rows
(6 under AVX2: PackedLinear.strip_max_rows) kernels/cpu_grid_linear.c's strips (4.4x the float32
tiles at one row, 3.3x at 4, with AVX-512), then up to 64 rows cpu_linear.c's grid tiles (1.9x at 8
rows, 1.2x at 16, 0.9-1.0x at 32-64, with the float32 tiles' results bit for bit), as
`linear_ab.py --grid` measures.
The weights the products use are the float32 ones exactly. KVSERVE_CPU_GRID=0 keeps the
float32 tiles.

Applied after loading (whatever the loader) to the decoder's linear layers and
the logits projection, for float32 models on the CPU without --quantization.
KVSERVE_CPU_PACKED_LINEAR=0 keeps F.linear (for A/B measurements).
"""
from __future__ import annotations

import os

import torch
from torch import nn

from kvserve.backend.models import gguf_codes, grid_weights
from kvserve.kernels import cpu_native

_LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
NATIVE_MAX_ROWS = 64  # at most this many rows take the native kernels (see above)
# The grid strips take a step of up to cpu_native.grid_strip_rows() rows, the rows one call widens each code
# for; more, the grid tiles (see above). One step's projections on SmolLM2's shapes, 2 threads
# (`linear_ab.py --grid`), strips / tiles in ms: on a Zen 4 EPYC with AVX-512 (4 rows a call), 5.8 / 9.9
# at 1 row, 8.8 / 9.9 at 4, 14.6 / 12.4 at 5, 16.2 / 13.2 at 6; under AVX2 (6 rows a call, the strip's
# outputs in turn) on a Zen 3 EPYC, 8.4 / 11.9 at 1, 12.9 / 14.9 at 4, 16.2 / 17.5 at 5, 16.9 / 21.8
# at 6, 24.6 / 24.4 at 7. Before AVX2 widened the codes once for several rows, its strips streamed the
# whole weight once per row (14.8 / 18.3 ms at 1 row, 26.3 / 21.5 at 2 on a Zen 1 EPYC).


class PackedLinear(nn.Module):
    """One layer's weight in the forms its steps read. float32 tiles serve every row count, with no
    oneDNN copy. Grid codes serve up to NATIVE_MAX_ROWS (their tiles run prefill 1.1-1.2x slower than
    float32), and oneDNN's float32 copy prefill, except where `few_rows`: a layer whose steps
    have few rows whatever the batch (the logits projection: one row per sequence, not per token),
    so its codes serve every step (Gemma 3's tied embedding: 671 MB saved). `keep_onednn`: oneDNN's
    copy is kept for steps of more rows all the same (the embedding encoder, whose passes are all
    prefill-sized and which fuses an activation into oneDNN's product)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 codes: gguf_codes.BlockCodes | None = None, few_rows: bool = False, keep_onednn: bool = False,
                 grid: grid_weights.GridWeight | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        # The native kernels' copies (None without them: no compiler, neither AVX-512 nor AVX2 + FMA): the grid codes
        # where the weight is on a grid (the GGUF file's own codes where the loader read them),
        # else the float32 tiles.
        runs = cpu_native.linear_available()
        self.grid = grid  # where the caller found it already
        if runs and grid is None and os.environ.get("KVSERVE_CPU_GRID", "1") != "0":
            self.grid = grid_weights.from_codes(codes, weight) if codes is not None else None
            self.grid = self.grid or grid_weights.find_grid(weight)
        self.native = cpu_native.pack_linear(weight) if runs and self.grid is None else None
        self.strip_max_rows = cpu_native.grid_strip_rows() if self.grid is not None else 0
        tiled = self.native is not None or (self.grid is not None and self.grid.tiles is not None)
        one_copy = (few_rows and tiled) or (self.native is not None and not keep_onednn)
        self.max_native_rows = (1 << 62) if one_copy else NATIVE_MAX_ROWS
        # An opaque oneDNN tensor: a plain attribute, not a parameter (nothing else reads it).
        self.packed = (None if self.max_native_rows > NATIVE_MAX_ROWS
                       else torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None and (x.dim() != 2 or not x.is_contiguous()):  # no oneDNN copy: the tiles take all
            return self(x.reshape(-1, self.in_features).contiguous()).view(*x.shape[:-1], self.out_features)
        rows = x.shape[0] if x.dim() == 2 else NATIVE_MAX_ROWS + 1
        out = None
        if self.grid is not None and rows <= self.strip_max_rows:
            out = cpu_native.grid_linear_strips(x, self.grid.strips, self.grid.kind, self.out_features, self.bias)
        elif self.grid is not None and self.grid.tiles is not None and rows <= self.max_native_rows:
            out = cpu_native.linear_grid(x, self.grid.tiles, self.grid.kind, self.out_features, self.bias)
        elif self.native is not None and rows <= self.max_native_rows:
            out = cpu_native.linear(x, self.native, self.out_features, self.bias)
        if out is not None:
            return out
        if self.packed is None:  # contiguous float32 rows: the native kernels take every one
            raise RuntimeError(f"native linear declined {tuple(x.shape)} {x.dtype} rows it was kept for")
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


class CodedEmbedding(nn.Module):
    """A tied embedding kept only as the logits projection's grid codes: the lookup dequantizes the
    rows it needs (bit for bit the float32 rows), so the float32 table is not held as well."""

    def __init__(self, grid: grid_weights.GridWeight) -> None:
        super().__init__()
        self.grid = grid

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # The native expansion: ~20 torch operations took 0.12 ms of a 6 ms batch-1 decode step.
        g = self.grid
        rows = cpu_native.grid_rows(g.strips, g.kind, input_ids, g.out_features, g.in_features)
        return rows if rows is not None else grid_weights.dequantize_rows(g, input_ids)


class TiledEmbedding(nn.Module):
    """A tied float32 embedding kept only as the logits projection's tiles: the lookup gathers the
    rows it needs from them (the same values), so the table is not held twice (108 MiB for SmolLM2)."""

    def __init__(self, tiles: torch.Tensor, embedding_dim: int) -> None:
        super().__init__()
        self.tiles, self.embedding_dim = tiles, embedding_dim

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return cpu_native.linear_rows(self.tiles, input_ids, self.embedding_dim)


def wants_cpu_linear(device: torch.device, dtype: torch.dtype, quantization: str) -> bool:
    return (device.type == "cpu" and dtype == torch.float32 and quantization == "none"
            and torch.backends.mkldnn.is_available() and os.environ.get("KVSERVE_CPU_PACKED_LINEAR", "1") != "0")


def pack_linears(model: nn.Module, block_codes: dict[str, gguf_codes.BlockCodes] | None = None) -> nn.Module:
    """Replace the decoder's linear layers and its logits projection with `PackedLinear`; returns the
    model. `block_codes`: the GGUF codes the loader read, by parameter name (consumed)."""
    codes = block_codes if block_codes is not None else {}
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            for name in _LINEARS:
                linear = getattr(layer, name)
                setattr(layer, name, PackedLinear(linear.weight, linear.bias, codes.pop(f"layers.{i}.{name}.weight", None)))
        if not getattr(model, "is_last_stage", True):  # a pipeline stage that computes no logits
            codes.clear()
            return model
        tied = model.lm_head is None
        weight = model.embed_tokens.weight if tied else model.lm_head
        model.logits_proj = PackedLinear(weight, None, codes.pop("embed_tokens.weight" if tied else "lm_head", None),
                                         few_rows=True)
        if tied and model.logits_proj.grid is not None:  # the codes serve the lookup too (Gemma 3: 671 MB)
            model.embed_tokens = CodedEmbedding(model.logits_proj.grid)
        elif tied and model.logits_proj.native is not None and model.logits_proj.native.dtype == torch.float32:
            model.embed_tokens = TiledEmbedding(model.logits_proj.native, model.logits_proj.in_features)
        codes.clear()
        if model.lm_head is not None:  # untied: the plain copy is never read again
            model.lm_head = None
    return model
