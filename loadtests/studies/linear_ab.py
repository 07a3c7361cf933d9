"""A/B of the CPU linear layers: oneDNN's packed linear against kernels/cpu_linear.c, alternated.

    .venv/bin/python loadtests/studies/linear_ab.py --rows 1,16,32,64,256 --rounds 2

Times one decode step's worth of projections (every layer's qkv, o, gate/up and
down, then the logits projection) with random weights of the given shapes
(SmolLM2-135M's by default), each layer's weights its own tensors: as in the
engine, the weights come from memory, not from the cache. Each round runs
oneDNN then the native kernel at every row count; prints ms per step and their
ratio. One-off measurement, not installed.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from kvserve.kernels import cpu_native


def _weights(layers: int, hidden: int, inner: int, q_out: int, vocab: int):
    shapes = [(q_out, hidden), (hidden, hidden), (2 * inner, hidden), (hidden, inner)]
    g = torch.Generator().manual_seed(0)
    per_layer = [[torch.randn(n, k, generator=g) * 0.05 for n, k in shapes] for _ in range(layers)]
    return shapes, per_layer + [[torch.randn(vocab, hidden, generator=g) * 0.05]]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,16,32,64,256")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--qkv-out", type=int, default=960)
    p.add_argument("--vocab", type=int, default=49152)
    args = p.parse_args()
    if cpu_native.pack_linear(torch.zeros(1, 1)) is None:
        raise SystemExit("the native linear kernel does not run here (no C compiler or no AVX-512)")
    shapes, weights = _weights(args.layers, args.hidden, args.intermediate, args.qkv_out, args.vocab)
    onednn = [[torch.ops.mkldnn._reorder_linear_weight(w, None) for w in layer] for layer in weights]
    native = [[cpu_native.pack_linear(w) for w in layer] for layer in weights]
    outs = [[w.shape[0] for w in layer] for layer in weights]

    def step(kind: str, xs: list[torch.Tensor]) -> None:
        for layer, (d_layer, n_layer, out_layer) in enumerate(zip(onednn, native, outs)):
            inputs = xs if layer < args.layers else xs[:1]
            for x, d, n, out in zip(inputs, d_layer, n_layer, out_layer):
                if kind == "onednn":
                    torch.ops.mkldnn._linear_pointwise(x, d, None, "none", [], "")
                else:
                    cpu_native.linear(x, n, out, None)

    results: dict[int, dict[str, list[float]]] = {}
    for _ in range(args.rounds):
        for rows in map(int, args.rows.split(",")):
            xs = [torch.randn(rows, k) for _, k in shapes]
            reps = 10 if rows <= 64 else 3
            for kind in ("onednn", "native"):
                step(kind, xs)
                started = time.perf_counter()
                for _ in range(reps):
                    step(kind, xs)
                results.setdefault(rows, {}).setdefault(kind, []).append((time.perf_counter() - started) / reps * 1e3)
    print(f"threads {torch.get_num_threads()}; ms per step of projections (median of {args.rounds} rounds)")
    for rows, r in results.items():
        a, b = statistics.median(r["onednn"]), statistics.median(r["native"])
        print(f"rows {rows:5d}  oneDNN {a:8.1f}  native {b:8.1f}  oneDNN/native {a / b:5.2f}")


if __name__ == "__main__":
    main()
