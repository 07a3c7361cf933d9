"""`--plot out.png`: latency CDFs (TTFT, ITL, E2EL) and throughput over time.

matplotlib is imported here only, with the Agg backend, so the benchmark runs
on headless machines and pays the import only when a plot is asked for.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from kvserve.loadtests.bench.bench_request import RequestRecord
from kvserve.loadtests.bench.timeline import build_timeline


def _cdf(ax, values_ms: Sequence[float], title: str) -> None:
    ax.set_title(title)
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of samples")
    ax.grid(True, alpha=0.3)
    if len(values_ms) == 0:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        return
    xs = np.sort(np.asarray(values_ms))
    ax.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post")
    for p, style in ((50, ":"), (99, "--")):
        ax.axvline(float(np.percentile(xs, p)), linestyle=style, color="gray", label=f"p{p}")
    ax.legend(loc="lower right")


def write_plot(records: Sequence[RequestRecord], duration: float, path: str | Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if r.success]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    _cdf(axes[0][0], [r.ttft * 1000 for r in ok], "TTFT CDF")
    _cdf(axes[0][1], [g * 1000 for r in ok for g in r.itl], "ITL CDF")
    _cdf(axes[1][0], [r.e2el * 1000 for r in ok], "E2E latency CDF")

    tl = build_timeline(records, duration)
    ax = axes[1][1]
    ax.set_title("Throughput over time")
    ax.plot(tl.bin_starts, tl.output_tokens_per_s, label="output tok/s")
    ax.set_xlabel("s since start")
    ax.set_ylabel("output tokens/s")
    ax.grid(True, alpha=0.3)
    twin = ax.twinx()
    twin.plot(tl.bin_starts, tl.running, color="tab:orange", alpha=0.6, label="requests in flight")
    twin.set_ylabel("requests in flight")
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper right")

    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
