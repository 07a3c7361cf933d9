"""offcpu: off-CPU time of the engine's threads split by cause, from `perf script`
text of sched_switch / sched_waking events."""
from __future__ import annotations

import json

import pytest

from kvserve.loadtests.studies.offcpu import PREEMPTED, analyze, main

# Engine thread 100 and its OpenMP worker 101; host main thread 50 ("python3", holds
# the GIL); 60 is some other program. Times in seconds, as perf prints them.
EVENTS = """\
  100 1000.000000: sched:sched_switch: prev_comm=kvserve-engine prev_pid=100 prev_prio=120 prev_state=R ==> next_comm=python3 next_pid=50 next_prio=120
   50 1000.000300: sched:sched_switch: prev_comm=python3 prev_pid=50 prev_prio=120 prev_state=S ==> next_comm=kvserve-engine next_pid=100 next_prio=120
  100 1000.001000: sched:sched_switch: prev_comm=kvserve-engine prev_pid=100 prev_prio=120 prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
   60 1000.001500: sched:sched_waking: comm=kvserve-engine pid=101 prio=120 target_cpu=001
   50 1000.003000: sched:sched_waking: comm=kvserve-engine pid=100 prio=120 target_cpu=000
   60 1000.003100: sched:sched_waking: comm=kvserve-engine pid=100 prio=120 target_cpu=000
    0 1000.003500: sched:sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=kvserve-engine next_pid=100 next_prio=120
  101 1000.004000: sched:sched_switch: prev_comm=kvserve-engine prev_pid=101 prev_prio=120 prev_state=S ==> next_comm=other next_pid=60 next_prio=120
  100 1000.005000: sched:sched_waking: comm=kvserve-engine pid=101 prio=120 target_cpu=001
   60 1000.006000: sched:sched_switch: prev_comm=other prev_pid=60 prev_prio=120 prev_state=S ==> next_comm=kvserve-engine next_pid=101 next_prio=120
  100 1000.008000: sched:sched_switch: prev_comm=kvserve-engine prev_pid=100 prev_prio=120 prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
    0 1005.000000: sched:sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=kvserve-engine next_pid=100 next_prio=120
this line is not an event and is skipped
"""


def test_each_stretch_off_cpu_is_charged_to_preemption_or_to_the_first_waker():
    engine, worker = analyze(EVENTS.splitlines(), "kvserve-engine", idle_gap_s=1.0)
    assert (engine.tid, worker.tid) == (100, 101)
    # Preempted for 0.3 ms; asleep 2.5 ms until the GIL holder (python3) woke it. The
    # second waking is ignored; the last 5 s asleep is idle (over the gap) and not counted.
    assert engine.off_s[PREEMPTED] == pytest.approx(0.0003)
    assert engine.off_s["asleep, woken by python3"] == pytest.approx(0.0025)
    assert sum(engine.count.values()) == 2
    assert engine.on_cpu_s == pytest.approx(0.0007 + 0.0045)
    # The worker slept at a barrier until the engine thread woke it; a waking before it
    # went to sleep does not count.
    assert dict(worker.off_s) == {"asleep, woken by kvserve-engine": pytest.approx(0.002)}


def test_cli_prints_the_split_and_writes_json(tmp_path, capsys):
    events = tmp_path / "sched.txt"
    events.write_text(EVENTS)
    out = tmp_path / "offcpu.json"
    assert main([str(events), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "tid 100 (engine thread)" in text and "tid 101 (OpenMP worker)" in text
    assert "woken by python3" in text
    doc = json.loads(out.read_text())
    assert doc["threads"][0]["off_cpu_s"] == pytest.approx(0.0028)
    assert main([str(events), "--thread", "nobody"]) == 1
