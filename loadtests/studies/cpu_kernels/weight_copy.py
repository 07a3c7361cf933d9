"""What the float32 path's one copy of the weights costs and saves (BENCHMARKS.md section 7, tenth point).

    .venv/bin/python loadtests/studies/cpu_kernels/weight_copy.py --model DIR [--off-grid-from SRC] \
        [--prompts 256,1024] [--rounds 8]

- memory: the RSS a float32 model adds when loaded (a 16 MiB KV cache), as kvserve holds it and
  with plain `nn.Linear` (KVSERVE_CPU_PACKED_LINEAR=0: exactly one float32 copy), each in a fresh
  process; the difference between the two is what the packed forms hold beyond one copy;
- prefill: a prompt's time to its one token (no prefix cache) with the float32 tiles serving every
  row, against oneDNN's reordered copy above 64 rows as before. The oneDNN copy is built from
  the tiles' own values, and the two are alternated in one process.
Needs a model whose weights lie on no GGUF grid (else its layers hold codes, not float32 tiles).
One-off measurement, not installed.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import statistics
import subprocess
import sys
import time

_KV_BYTES = 16 * 2**20


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024


def _load_growth(model: str) -> None:
    """In this process: print the RSS growth over loading `model`, then after malloc_trim."""
    from kvserve.backend import LLM

    before = _rss_mib()
    llm = LLM(model=model, dtype="float32", kv_cache_memory=_KV_BYTES, max_model_len=256)
    grown = _rss_mib() - before
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    print(f"{grown:.0f} {_rss_mib() - before:.0f}", flush=True)
    del llm


def memory(model: str) -> None:
    sides = {"kvserve (tiles)": {}, "nn.Linear, one copy": {"KVSERVE_CPU_PACKED_LINEAR": "0"}}
    for name, env in sides.items():
        out = subprocess.run([sys.executable, __file__, "--model", model, "--load-growth"], check=True,
                             capture_output=True, text=True, env={**os.environ, **env}).stdout.split()
        print(f"{name:22s} RSS growth {out[-2]:>5s} MiB, after malloc_trim {out[-1]:>5s} MiB")


def prefill(model: str, lengths: list[int], rounds: int) -> None:
    import torch

    from kvserve.backend import LLM, SamplingParams
    from kvserve.backend.models.cpu_linear import NATIVE_MAX_ROWS, PackedLinear
    from kvserve.kernels import cpu_native

    llm = LLM(model=model, dtype="float32", enable_prefix_caching=False, max_model_len=max(lengths) + 16)
    layers = [m for m in llm.engine.runner.model.modules() if isinstance(m, PackedLinear) and m.native is not None]
    if not layers:
        raise SystemExit("no float32 tiles here (no native kernels, or the weights lie on a grid)")
    onednn = {}
    for m in layers:
        w = cpu_native.linear_rows(m.native, torch.arange(m.out_features), m.in_features).contiguous()
        onednn[m] = torch.ops.mkldnn._reorder_linear_weight(w, None)
    tiles_rows = {m: m.max_native_rows for m in layers}

    def use_onednn(on: bool) -> None:
        for m in layers:
            m.packed, m.max_native_rows = (onednn[m], NATIVE_MAX_ROWS) if on else (None, tiles_rows[m])

    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=1, temperature=0)
    for length in lengths:
        times = {False: [], True: []}
        for r in range(rounds):
            for on in (False, True) if r % 2 == 0 else (True, False):
                use_onednn(on)
                ids = torch.randint(100, 40000, (length,), generator=gen).tolist()
                start = time.perf_counter()
                llm.generate([ids], params)
                times[on].append(time.perf_counter() - start)
        use_onednn(False)
        tiles, copy = statistics.median(times[False][1:]), statistics.median(times[True][1:])
        print(f"prompt {length:5d}: tiles {tiles:.3f} s, oneDNN copy {copy:.3f} s, tiles / oneDNN {tiles / copy:.3f}")


def write_off_grid(source: str, out: str) -> None:
    """`out`: the float32 folder `source` (a GGUF written out, whose weights lie on its grid) with every
    matrix's values scaled by 1 + 2**-18 or 1 - 2**-18 at random, so that none lies on a grid."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    os.makedirs(out, exist_ok=True)
    for name in os.listdir(source):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(source, name), out)
    gen = torch.Generator().manual_seed(0)
    for name in sorted(n for n in os.listdir(source) if n.endswith(".safetensors")):
        moved = {}
        for key, value in load_file(os.path.join(source, name)).items():
            if value.dim() >= 2:
                up = torch.rand(value.shape, generator=gen) < 0.5
                value = value * torch.where(up, 1 + 2.0 ** -18, 1 - 2.0 ** -18).to(value.dtype)
            moved[key] = value.contiguous()
        save_file(moved, os.path.join(out, name), metadata={"format": "pt"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a float32 model folder whose weights lie on no grid")
    parser.add_argument("--prompts", default="256,1024", help="prompt lengths for the prefill A/B")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--off-grid-from", metavar="SRC",
                        help="first write --model from this float32 folder, every weight moved off its grid")
    parser.add_argument("--load-growth", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.off_grid_from:
        write_off_grid(args.off_grid_from, args.model)
    if args.load_growth:
        _load_growth(args.model)
        return
    memory(args.model)
    prefill(args.model, [int(n) for n in args.prompts.split(",")], args.rounds)


if __name__ == "__main__":
    main()
