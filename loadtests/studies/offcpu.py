"""Why the served engine thread is off its core: off-CPU time of chosen threads,
split by cause, from the kernel's scheduler events over a `kvserve bench` run.

    perf record -a -e sched:sched_switch -e sched:sched_waking -o sched.data -- \\
        kvserve bench --base-url http://127.0.0.1:8000 --dataset-name lognormal ...
    perf script -i sched.data -F tid,time,event,trace > sched.txt
    python -m kvserve.loadtests.studies.offcpu sched.txt [--thread kvserve-engine]

For every thread whose name is `--thread` (torch's OpenMP workers inherit the
engine thread's name, so the lowest thread id is the engine's own), each stretch
off the CPU ends in one of two ways: the thread was preempted (runnable, waiting
for a core), or it slept and another thread woke it. The waker says what it
waited for: a Python thread of its own process means the GIL (a thread that
releases the GIL wakes the one waiting for it), a thread of its own name its
OpenMP partner at a barrier. thread_cpu.py counts the same sleeps from /proc;
this says who ended them. Stretches longer than `--idle-gap` (no requests) are
left out.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from kvserve.loadtests.bench.report import write_json

_EVENT = re.compile(r"^\s*(\d+)\s+(?:\[\d+\]\s+)?(\d+\.\d+):\s+sched:(sched_switch|sched_waking|sched_wakeup):\s+(.*)$")
_SWITCH = re.compile(r"prev_comm=(.*?) prev_pid=(\d+) .*?prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)")
_WAKING = re.compile(r"comm=(.*?) pid=(\d+) ")
PREEMPTED = "preempted (runnable, waiting for a core)"


@dataclass(slots=True)
class OffCpu:
    tid: int
    on_cpu_s: float = 0.0
    off_s: Counter = field(default_factory=Counter)  # cause -> seconds
    count: Counter = field(default_factory=Counter)  # cause -> stretches
    _in_since: float | None = None
    _out_since: float | None = None
    _preempted: bool = False
    _waker: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {"tid": self.tid, "on_cpu_s": self.on_cpu_s, "off_cpu_s": sum(self.off_s.values()),
                "causes": [{"cause": c, "seconds": s, "stretches": self.count[c]} for c, s in self.off_s.most_common()]}


def analyze(lines: Iterable[str], thread_name: str, idle_gap_s: float = 1.0) -> list[OffCpu]:
    names: dict[int, str] = {0: "interrupt/idle"}
    tracked: dict[int, OffCpu] = {}
    for line in lines:
        m = _EVENT.match(line)
        if not m:
            continue
        current, t, kind, rest = int(m.group(1)), float(m.group(2)), m.group(3), m.group(4)
        if kind == "sched_switch":
            s = _SWITCH.search(rest)
            if not s:
                continue
            prev, nxt = int(s.group(2)), int(s.group(5))
            names[prev], names[nxt] = s.group(1), s.group(4)
            for tid in (prev, nxt):
                if tid not in tracked and names[tid] == thread_name:
                    tracked[tid] = OffCpu(tid)
            if prev in tracked:
                _switched_out(tracked[prev], t, s.group(3))
            if nxt in tracked:
                _switched_in(tracked[nxt], t, idle_gap_s)
        else:
            w = _WAKING.search(rest + " ")
            if w and int(w.group(2)) in tracked:
                state = tracked[int(w.group(2))]
                if state._out_since is not None and state._waker is None:
                    state._waker = names.get(current, f"thread {current}")
    return [tracked[tid] for tid in sorted(tracked)]


def _switched_out(state: OffCpu, t: float, prev_state: str) -> None:
    if state._in_since is not None:
        state.on_cpu_s += t - state._in_since
    state._in_since, state._out_since = None, t
    state._preempted, state._waker = prev_state.startswith("R"), None


def _switched_in(state: OffCpu, t: float, idle_gap_s: float) -> None:
    if state._out_since is not None and t - state._out_since <= idle_gap_s:
        cause = PREEMPTED if state._preempted else f"asleep, woken by {state._waker or 'unknown'}"
        state.off_s[cause] += t - state._out_since
        state.count[cause] += 1
    state._in_since, state._out_since = t, None


def format_report(threads: list[OffCpu], thread_name: str) -> str:
    out = []
    for i, th in enumerate(threads):
        role = "engine thread" if i == 0 else "OpenMP worker"
        out.append(f"{thread_name} tid {th.tid} ({role}): on CPU {th.on_cpu_s:.2f} s, "
                   f"off CPU {sum(th.off_s.values()):.2f} s")
        for cause, seconds in th.off_s.most_common():
            n = th.count[cause]
            out.append(f"  {seconds:7.3f} s  {n:6d} x  {1e3 * seconds / n:6.2f} ms  {cause}")
    return "\n".join(out) if out else f"no thread named {thread_name!r} in the events"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.studies.offcpu", description=__doc__.split("\n\n")[0])
    p.add_argument("perf_script", help="`perf script -F tid,time,event,trace` output ('-': stdin)")
    p.add_argument("--thread", default="kvserve-engine", help="thread name to follow (all threads of that name)")
    p.add_argument("--idle-gap", type=float, default=1.0, help="longer stretches off CPU are idle, not counted (s)")
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    stream = sys.stdin if opts.perf_script == "-" else open(opts.perf_script, errors="replace")
    with stream:
        threads = analyze(stream, opts.thread, opts.idle_gap)
    print(format_report(threads, opts.thread))
    if opts.json_path:
        print(f"wrote {write_json({'thread': opts.thread, 'threads': [t.as_dict() for t in threads]}, opts.json_path)}")
    return 0 if threads else 1


if __name__ == "__main__":
    sys.exit(main())
