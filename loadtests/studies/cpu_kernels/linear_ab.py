"""A/B of the CPU linear layers: oneDNN's packed linear against kernels/cpu_linear.c, alternated.

    .venv/bin/python loadtests/studies/cpu_kernels/linear_ab.py --rows 1,16,32,64,256 --rounds 2 [--int8 | --int4 | --grid]

Times one decode step's worth of projections (every layer's qkv, o, gate/up and
down, then the logits projection) with random weights of the given shapes
(SmolLM2-135M's by default), each layer's weights its own tensors: as in the
engine, the weights come from memory, not from the cache. Each round runs
oneDNN then the native kernel at every row count; prints ms per step and their
ratio. With --int8 the weights are `--quantization int8`'s codes and the baseline
is torch's `_weight_int8pack_mm` (bfloat16 activations, as quantize.py runs it
without the native kernel); --int4 likewise against `_weight_int4pack_mm_for_cpu`, with the
int4 codes in the grid kernel's strips as a third side, and where the machine has them the
strips with int8 activations (kernels/cpu_grid_int8_dot.c) as a fourth. With --grid the
float32 weights lie on GGUF's grids (Q4_1 in the layers, Q8_0 in the logits projection, as
SmolLM2's GGUF), the baseline is the native float32 kernel and the other sides
kernels/cpu_grid_linear.c's strips and cpu_linear.c's grid tiles over their codes. One-off measurement, not installed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from kvserve.backend.models import grid_weights
from kvserve.backend.models.grid_weights import find_grid
from kvserve.backend.models.quantize import Int4Linear, Int8Linear
from kvserve.kernels import cpu_native


def _weights(layers: int, hidden: int, inner: int, q_out: int, vocab: int):
    shapes = [(q_out, hidden), (hidden, hidden), (2 * inner, hidden), (hidden, inner)]
    g = torch.Generator().manual_seed(0)
    per_layer = [[torch.randn(n, k, generator=g) * 0.05 for n, k in shapes] for _ in range(layers)]
    return shapes, per_layer + [[torch.randn(vocab, hidden, generator=g) * 0.05]]


def _on_grids(weights):
    """The weights moved onto GGUF's block grids, computed as numpy dequantizes: d * q + m per
    block of 32 (Q4_1) in the layers, d * q (Q8_0) in the logits projection."""
    g = torch.Generator().manual_seed(1)
    out = []
    for i, layer in enumerate(weights):
        moved = []
        for w in layer:
            n, k = w.shape
            # Steps away from 0: a zero step would give -0.0 for negative codes, which no grid holds.
            d = (torch.rand(n, k // 32, 1, generator=g) * 0.01 + 1e-4).half().float()
            if i < len(weights) - 1:
                m = (-torch.rand(n, k // 32, 1, generator=g) * 0.08).half().float()
                q = torch.randint(0, 16, (n, k // 32, 32), generator=g).float()
                q[..., 0], q[..., 1] = 0, 15  # a quantizer's block spans its codes
                moved.append((d * q + m).reshape(n, k))
            else:
                q = torch.randint(-127, 128, (n, k // 32, 32), generator=g).float()
                q[..., 0] = 127
                moved.append((q * d).reshape(n, k))
        out.append(moved)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,16,32,64,256")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--qkv-out", type=int, default=960)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--int8", action="store_true", help="int8 codes: torch's int8 kernel against the native one")
    p.add_argument("--int4", action="store_true", help="int4 codes: torch's int4 kernel against the native one")
    p.add_argument("--grid", action="store_true", help="grid-valued float32 weights: native float32 against grid codes")
    args = p.parse_args()
    if cpu_native.pack_linear(torch.zeros(1, 1)) is None:
        raise SystemExit("the native linear kernel does not run here (no C compiler or no AVX-512)")
    shapes, weights = _weights(args.layers, args.hidden, args.intermediate, args.qkv_out, args.vocab)
    outs = [[w.shape[0] for w in layer] for layer in weights]
    dot_strips = None
    if args.grid:
        weights = _on_grids(weights)
        dense = [[cpu_native.pack_linear(w) for w in layer] for layer in weights]
        baseline = [[(lambda x, d=d, n=w.shape[0]: cpu_native.linear(x, d, n, None)) for d, w in zip(d_layer, layer)]
                    for d_layer, layer in zip(dense, weights)]
        native = [[(find_grid(w), "grid") for w in layer] for layer in weights]
    elif args.int8:
        quantized = [[Int8Linear(w, None) for w in layer] for layer in weights]
        native = [[(q.native, q.native_scales) for q in layer] for layer in quantized]
        for layer in quantized:
            for q in layer:
                q.native = None  # the module's own forward is then torch's kernel
        baseline = [[q.forward for q in layer] for layer in quantized]
    elif args.int4:
        os.environ["KVSERVE_CPU_INT8_DOT"] = "0"  # int4's tiles and its float32-activation strips
        quantized = [[Int4Linear(w, None) for w in layer] for layer in weights]
        del os.environ["KVSERVE_CPU_INT8_DOT"]
        native = [[(q.native, "int4") for q in layer] for layer in quantized]
        strips = [[q.strips for q in layer] for layer in quantized]
        if cpu_native.int8_dot_available():  # and the int8-activation strips
            dot_strips = [[Int4Linear(w, None).strips for w in layer] for layer in weights]
        for layer in quantized:
            for q in layer:
                q.native = q.strips = None  # the module's own forward is then torch's kernel
        baseline = [[q.forward for q in layer] for layer in quantized]
    else:
        packed = [[torch.ops.mkldnn._reorder_linear_weight(w, None) for w in layer] for layer in weights]
        baseline = [[(lambda x, d=d: torch.ops.mkldnn._linear_pointwise(x, d, None, "none", [], "")) for d in layer]
                    for layer in packed]
        native = [[(cpu_native.pack_linear(w), None) for w in layer] for layer in weights]

    def step(kind: str, xs: list[torch.Tensor]) -> None:
        for layer, (b_layer, n_layer, out_layer) in enumerate(zip(baseline, native, outs)):
            inputs = xs if layer < args.layers else xs[:1]
            for i, (x, base, (codes, scales), out) in enumerate(zip(inputs, b_layer, n_layer, out_layer)):
                if kind == "baseline":
                    base(x)
                elif kind == "tiles" and args.int4:
                    cpu_native.grid_linear_strips(x, strips[layer][i], grid_weights.INT4, out, None)
                elif kind == "dot":
                    cpu_native.grid_linear_strips(x, dot_strips[layer][i], grid_weights.INT4_Q8, out, None)
                elif kind == "tiles":
                    cpu_native.linear_grid(x, codes.tiles, codes.kind, out, None)
                elif scales == "grid":
                    cpu_native.grid_linear_strips(x, codes.strips, codes.kind, out, None)
                elif isinstance(scales, str):
                    cpu_native.linear_i4(x, codes, out, None)
                else:
                    cpu_native.linear(x, codes, out, None, scales)

    results: dict[int, dict[str, list[float]]] = {}
    for _ in range(args.rounds):
        for rows in map(int, args.rows.split(",")):
            xs = [torch.randn(rows, k) for _, k in shapes]
            reps = 10 if rows <= 64 else 3
            sides = ("baseline", "native", "tiles") if args.grid or args.int4 else ("baseline", "native")
            for kind in sides + (("dot",) if dot_strips else ()):
                step(kind, xs)
                started = time.perf_counter()
                for _ in range(reps):
                    step(kind, xs)
                results.setdefault(rows, {}).setdefault(kind, []).append((time.perf_counter() - started) / reps * 1e3)
    name = "torch int8" if args.int8 else "torch int4" if args.int4 else "f32 native" if args.grid else "oneDNN"
    print(f"threads {torch.get_num_threads()}; ms per step of projections (median of {args.rounds} rounds)")
    for rows, r in results.items():
        a, b = statistics.median(r["baseline"]), statistics.median(r["native"])
        other = "grid strips" if args.grid else "native"
        line = f"rows {rows:5d}  {name} {a:8.1f}  {other} {b:8.1f}  {name}/{other} {a / b:5.2f}"
        if args.grid or args.int4:
            c = statistics.median(r["tiles"])
            label = "int4 strips" if args.int4 else "grid tiles"
            line += f"  {label} {c:8.1f}  {name}/{label.split()[1]} {a / c:5.2f}"
        if dot_strips:
            d = statistics.median(r["dot"])
            line += f"  int4 strips int8 x {d:8.1f}  {name}/int8 x {a / d:5.2f}"
        print(line)


if __name__ == "__main__":
    main()
