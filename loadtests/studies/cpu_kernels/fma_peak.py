"""The machine's peak rate of the native kernels' 16-lane FMA (kernels/cpu_vec16.h), per thread.

    .venv/bin/python loadtests/studies/cpu_kernels/fma_peak.py [--threads 1,2] [--weights 134.5e6]

Builds a loop of independent v16 FMAs with the kernels' own compiler and flags and times it on 1
and on N threads, so the figures say what bounds the projections: one decode row costs one v16
FMA per 16 weights, so `--weights` (SmolLM2-135M's by default) gives the floor in ms of one more
row in a step (every core busy). On the 2-core AMD EPYCs of this project's CI (cpu family 23, no
AVX-512) it measured ~2.4 G v16 FMAs per second per core, i.e. one 256-bit FMA a cycle: the extra
rows of BENCHMARKS §7's grid tiles cost what this predicts. One-off measurement, not installed.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[3] / "kernels"

_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
#include "cpu_vec16.h"
#ifndef KVSERVE_VEC16
int main(void) { puts("no 16-lane vector path on this CPU"); return 1; }
#else
#define CHAINS (KVSERVE_V16_REGS == 8 ? 6 : 12) /* independent sums the registers hold */
int main(int argc, char **argv) {
    const long iters = atol(argv[1]);
    double best = 1e30;
    float sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        const double t0 = omp_get_wtime();
#pragma omp parallel reduction(+ : sink)
        {
            v16 acc[CHAINS];
            for (int i = 0; i < CHAINS; i++) acc[i] = v16_set1(0.001f * (i + omp_get_thread_num()));
            const v16 a = v16_set1(0.999f), b = v16_set1(0.0001f);
            for (long n = 0; n < iters; n++)
                for (int i = 0; i < CHAINS; i++) acc[i] = v16_fma(acc[i], a, b);
            for (int i = 0; i < CHAINS; i++) sink += v16_reduce_add(acc[i]);
        }
        const double t = omp_get_wtime() - t0;
        if (t < best) best = t;
    }
    printf("%.6f %d %f\n", best, CHAINS, sink);
    return 0;
}
#endif
"""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", default=f"1,{os.cpu_count()}")
    p.add_argument("--iters", type=int, default=50_000_000)
    p.add_argument("--weights", type=float, default=134.5e6, help="a model's projection weights")
    args = p.parse_args()
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("no C compiler")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "fma_peak.c", Path(tmp) / "fma_peak"
        src.write_text(_SOURCE)
        subprocess.run([compiler, "-O3", "-march=native", "-fopenmp", f"-I{KERNELS}", "-o", str(exe), str(src)],
                       check=True)
        for threads in (int(t) for t in args.threads.split(",")):
            out = subprocess.run([str(exe), str(args.iters)], check=True, capture_output=True, text=True,
                                 env={**os.environ, "OMP_NUM_THREADS": str(threads)}).stdout.split()
            seconds, chains = float(out[0]), int(out[1])
            per_thread = args.iters * chains / seconds
            row_ms = 1000 * args.weights / 16 / (per_thread * threads)
            print(f"threads {threads}: {per_thread / 1e9:.2f} G v16 FMAs/s per thread; one decode row of "
                  f"{args.weights / 1e6:.1f} M weights costs >= {row_ms:.2f} ms of FMAs on {threads} thread(s)")


if __name__ == "__main__":
    main()
