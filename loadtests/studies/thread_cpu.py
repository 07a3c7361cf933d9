"""Where the CPU goes while kvserve serves: per thread of the gateway and the
engine host, CPU time, time spent runnable but waiting for a core, and how often
each thread went to sleep (voluntary) or was preempted (involuntary), over one
`kvserve bench` run; plus the benchmark client's own CPU.

    python -m kvserve.loadtests.studies.thread_cpu [--serve-flag=--stream-interval --serve-flag=4] \\
        -- --dataset-name lognormal --num-prompts 64 --random-input-len 160 ...

Reads /proc (Linux only). kvserve names its threads at the OS level
(observability/thread_names.py); torch's OpenMP workers inherit the engine
thread's name, so "kvserve-engine" rows are the model's compute. A served engine
whose threads sleep tens of thousands of times in a run is waiting for the GIL or
for its OpenMP workers; an offline run sleeps a few dozen times.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
from collections import defaultdict
from dataclasses import dataclass, fields
from pathlib import Path

from kvserve.loadtests.compare.baseline_kvserve import ServeProcess
from kvserve.loadtests.bench.bench_once import bench_once
from kvserve.loadtests.compare.compare_model import ensure_bench_model
from kvserve.loadtests.bench.report import write_json

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(slots=True)
class ThreadStats:
    cpu_s: float = 0.0
    runqueue_wait_s: float = 0.0
    voluntary: int = 0
    involuntary: int = 0

    def minus(self, other: "ThreadStats") -> "ThreadStats":
        return ThreadStats(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def plus(self, other: "ThreadStats") -> "ThreadStats":
        return ThreadStats(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


def stat_cpu_s(stat_path: Path) -> float:
    """User + system CPU seconds from a /proc .../stat file (a process's or a thread's)."""
    stat = stat_path.read_text()
    after_name = stat[stat.rindex(")") + 2:].split()  # the name may contain spaces
    return (int(after_name[11]) + int(after_name[12])) / _TICKS  # utime + stime (fields 14, 15)


def _read_thread(task: Path) -> tuple[str, ThreadStats]:
    name = (task / "comm").read_text().strip()
    cpu_s = stat_cpu_s(task / "stat")
    wait_ns = int((task / "schedstat").read_text().split()[1])
    status = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
    return name, ThreadStats(cpu_s, wait_ns / 1e9, int(status["voluntary_ctxt_switches"]),
                             int(status["nonvoluntary_ctxt_switches"]))


def snapshot(pid: int) -> dict[int, tuple[str, ThreadStats]]:
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = _read_thread(task)
        except (OSError, ValueError, KeyError):  # the thread ended meanwhile
            continue
    return out


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def by_thread_name(before: dict[int, tuple[str, ThreadStats]],
                   after: dict[int, tuple[str, ThreadStats]]) -> dict[str, ThreadStats]:
    """Threads grouped by OS name (unnamed ones are the process's own name)."""
    total: dict[str, ThreadStats] = defaultdict(ThreadStats)
    for tid, (name, stats) in after.items():
        total[name] = total[name].plus(stats.minus(before[tid][1]) if tid in before else stats)
    return dict(total)


def run(opts: argparse.Namespace) -> dict[str, object]:
    model_dir = ensure_bench_model(opts.model)
    with ServeProcess(model_dir, opts.serve_flag, opts.startup_timeout) as server:
        gateway = server.pid
        processes = {"gateway": gateway, **{f"host-{i}": p for i, p in enumerate(children(gateway))}}
        before: dict[str, dict[int, tuple[str, ThreadStats]]] = {}
        client_before: list[resource.struct_rusage] = []

        def on_warm() -> None:
            before.update({label: snapshot(pid) for label, pid in processes.items()})
            client_before.append(resource.getrusage(resource.RUSAGE_SELF))

        metrics = asyncio.run(bench_once(server.base_url, opts.bench_args, on_warm))
        after = {label: snapshot(pid) for label, pid in processes.items()}
        client_after = resource.getrusage(resource.RUSAGE_SELF)
    tokens = float(metrics["total_output_tokens"])  # type: ignore[arg-type]
    rows = []
    for label in processes:
        for name, s in sorted(by_thread_name(before[label], after[label]).items(), key=lambda kv: -kv[1].cpu_s):
            rows.append({"process": label, "thread": name, "cpu_s": s.cpu_s, "runqueue_wait_s": s.runqueue_wait_s,
                         "voluntary": s.voluntary, "involuntary": s.involuntary})
    client_cpu = (client_after.ru_utime - client_before[0].ru_utime) + (client_after.ru_stime - client_before[0].ru_stime)
    rows.append({"process": "bench client", "thread": "(all)", "cpu_s": client_cpu, "runqueue_wait_s": None,
                 "voluntary": None, "involuntary": None})
    return {"model": model_dir, "serve_flags": opts.serve_flag, "bench_args": opts.bench_args,
            "duration_s": metrics["duration"], "output_tokens": tokens,
            "output_throughput": metrics["output_throughput"], "threads": rows}


def format_rows(doc: dict[str, object]) -> str:
    tokens = float(doc["output_tokens"])  # type: ignore[arg-type]
    lines = [f"{doc['output_tokens']:.0f} output tokens in {float(doc['duration_s']):.2f} s "  # type: ignore[arg-type]
             f"({float(doc['output_throughput']):.1f} tok/s)",  # type: ignore[arg-type]
             f"{'process':<13}{'thread':<18}{'CPU s':>8}{'us/token':>10}{'runq s':>8}{'sleeps':>9}{'preempted':>11}"]
    for r in doc["threads"]:  # type: ignore[union-attr]
        if r["cpu_s"] < 0.05:
            continue
        extra = "" if r["voluntary"] is None else \
            f"{r['runqueue_wait_s']:>8.2f}{r['voluntary']:>9}{r['involuntary']:>11}"
        lines.append(f"{r['process']:<13}{r['thread']:<18}{r['cpu_s']:>8.2f}"
                     f"{1e6 * r['cpu_s'] / max(tokens, 1):>10.0f}{extra}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.studies.thread_cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model folder (default: the benchmark model, made if missing)")
    p.add_argument("--serve-flag", action="append", default=[], help="a `kvserve serve` argument (repeatable)")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE")
    p.add_argument("bench_args", nargs="*", help="`kvserve bench` workload arguments, after --")
    return p


def main(argv: list[str] | None = None) -> int:
    if not sys.platform.startswith("linux"):
        print("thread_cpu reads /proc: Linux only", file=sys.stderr)
        return 2
    opts = build_parser().parse_args(argv)
    doc = run(opts)
    print(format_rows(doc))
    if opts.json_path:
        print(f"wrote {write_json(doc, opts.json_path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
