"""SCHED_BATCH for the threads that run engine steps: the served engine's thread and
its OpenMP team keep it; the offline LLM lends it to the caller's thread only while
the engine works; a thread its owner put under another policy is left alone."""
from __future__ import annotations

import os
import sys
import threading

import pytest
import torch

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.async_engine import AsyncEngine
from kvserve.backend.config import EngineConfig
from kvserve.backend.cpu_scheduling import batch_scheduling, restore_scheduling, use_batch_scheduling

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_BATCH is Linux's")


def _in_thread(fn):
    """Run fn on a fresh thread (so no test changes the policy of pytest's own thread)."""
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", fn()))
    thread.start()
    thread.join(30)
    return result["value"]


def _thread_policies() -> dict[int, tuple[str, int]]:
    policies = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                policies[int(tid)] = (f.read().strip(), os.sched_getscheduler(int(tid)))
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return policies


def test_the_calling_thread_moves_to_batch_and_threads_it_starts_inherit_it():
    def body():
        previous = use_batch_scheduling()
        mine = os.sched_getscheduler(0)
        child = _in_thread(lambda: os.sched_getscheduler(0))
        restore_scheduling(previous)
        return previous, mine, child, os.sched_getscheduler(0)

    assert _in_thread(body) == (os.SCHED_OTHER, os.SCHED_BATCH, os.SCHED_BATCH, os.SCHED_OTHER)


def test_a_policy_the_owner_chose_is_left_alone():
    def body():
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        with batch_scheduling():
            inside = os.sched_getscheduler(0)
        return inside, os.sched_getscheduler(0)

    assert _in_thread(body) == (os.SCHED_IDLE, os.SCHED_IDLE)


def test_disabled_changes_nothing():
    def body():
        with batch_scheduling(enabled=False):
            return os.sched_getscheduler(0)

    assert _in_thread(body) == os.SCHED_OTHER


@pytest.mark.parametrize("enabled", [True, False])
def test_served_engine_thread_and_its_openmp_team_run_under_the_configured_policy(llama_dir, enabled):
    before = set(_thread_policies())
    engine = AsyncEngine(EngineConfig(model=llama_dir, max_model_len=128, batch_scheduling=enabled))
    try:
        done = threading.Event()
        engine.add_request("r", "Once upon a time", SamplingParams(max_tokens=3, temperature=0),
                           lambda out: out.finished and done.set())
        assert done.wait(60)
        new = {tid: p for tid, p in _thread_policies().items() if tid not in before and p[0] == "kvserve-engine"}
    finally:
        engine.shutdown()
    # The engine thread, plus torch's OpenMP workers, which inherit its name and policy.
    assert len(new) >= min(2, torch.get_num_threads())
    expected = os.SCHED_BATCH if enabled else os.SCHED_OTHER
    assert {policy for _, policy in new.values()} == {expected}


def test_offline_llm_lends_batch_to_the_caller_only_while_the_engine_works(llama_dir):
    def body():
        llm = LLM(llama_dir, max_model_len=128)
        seen = []
        step = llm.engine.step
        llm.engine.step = lambda: (seen.append(os.sched_getscheduler(0)), step())[1]
        out = llm.generate("Once upon a time", SamplingParams(max_tokens=3, temperature=0))
        return set(seen), os.sched_getscheduler(0), len(out[0].outputs[0].token_ids)

    assert _in_thread(body) == ({os.SCHED_BATCH}, os.SCHED_OTHER, 3)
