"""Scheduler: token budget, max_num_seqs, chunked prefill, FCFS, preemption of the newest; the
priority policy's order and its least-urgent victim."""
from __future__ import annotations

from kvserve.backend.engine.request import Request, RequestStatus
from kvserve.backend.engine.sampling_params import SamplingParams
from kvserve.backend.engine.scheduler import Scheduler
from kvserve.backend.kv_cache.manager import KVCacheManager


def _sched(num_blocks=64, block_size=4, max_seqs=8, budget=32, caching=True, priority=False):
    return Scheduler(KVCacheManager(num_blocks, block_size, caching), max_seqs, budget, priority=priority)


def _req(rid, n, start=0, priority=0):
    return Request(rid, list(range(start, start + n)), SamplingParams(max_tokens=8, priority=priority), cache_key=None)


def _run(s: Scheduler, out, sample=7):
    """Pretend the model ran: advance computed tokens and append a token to sampling requests."""
    s.update_from_output(out, {sr.request_id: sample for sr in out.scheduled if sr.samples})


def test_long_prompt_is_chunked_and_mixed_with_decodes():
    s = _sched(budget=10)
    s.add_request(_req("short", 3))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"short": 3} and out.scheduled[0].samples
    _run(s, out)
    s.add_request(_req("long", 25, start=100))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"short": 1, "long": 9}
    long_chunk = next(x for x in out.scheduled if x.request_id == "long")
    assert not long_chunk.samples and long_chunk.start_position == 0
    _run(s, out)
    out = s.schedule()
    assert out.num_scheduled_tokens == {"short": 1, "long": 9}
    assert next(x for x in out.scheduled if x.request_id == "long").start_position == 9
    assert sum(out.num_scheduled_tokens.values()) <= 10


def test_max_num_seqs_and_fcfs():
    s = _sched(max_seqs=2, budget=100)
    for i in range(4):
        s.add_request(_req(f"r{i}", 4, start=10 * i))
    out = s.schedule()
    assert list(out.num_scheduled_tokens) == ["r0", "r1"]
    assert [r.request_id for r in s.waiting] == ["r2", "r3"]


def test_waiting_request_that_does_not_fit_blocks_later_ones():
    s = _sched(num_blocks=5, block_size=4, budget=100)  # 4 usable blocks = 16 tokens
    s.add_request(_req("big", 14))
    s.add_request(_req("huge", 20, start=50))
    s.add_request(_req("tiny", 1, start=90))
    out = s.schedule()
    assert list(out.num_scheduled_tokens) == ["big"]  # tiny waits behind huge (FCFS)


def test_preemption_takes_the_newest_and_requeues_it_first():
    s = _sched(num_blocks=5, block_size=4, budget=100)  # 16 token slots
    s.add_request(_req("old", 7))
    s.add_request(_req("new", 7, start=20))
    out = s.schedule()
    _run(s, out)
    _run(s, s.schedule())
    # Both hold 2 blocks (8 slots) and have 9 tokens: the next step needs a third block each.
    out = s.schedule()
    assert out.preempted_request_ids == ["new"]
    assert list(out.num_scheduled_tokens) == ["old"]
    new = s.requests["new"]
    assert new.status == RequestStatus.PREEMPTED and new.num_computed_tokens == 0 and s.kv.block_ids("new") == []
    assert s.waiting[0] is new and s.num_preemptions_total == 1


def test_priority_policy_starts_the_most_urgent_first_and_ties_in_arrival_order():
    s = _sched(max_seqs=2, budget=100, priority=True)
    for rid, prio in (("a", 5), ("b", 0), ("c", 5), ("d", -1)):
        s.add_request(_req(rid, 4, start=ord(rid), priority=prio))
    assert [r.request_id for r in s.waiting] == ["d", "b", "a", "c"]
    assert list(s.schedule().num_scheduled_tokens) == ["d", "b"]
    fcfs = _sched(max_seqs=2, budget=100)
    for rid, prio in (("a", 5), ("b", 0)):
        fcfs.add_request(_req(rid, 4, priority=prio))
    assert [r.request_id for r in fcfs.waiting] == ["a", "b"]  # first come, first served ignores it


def test_priority_policy_preempts_the_least_urgent_even_if_it_ran_first():
    s = _sched(num_blocks=5, block_size=4, budget=100, priority=True)  # 4 blocks of 4 token slots
    s.add_request(_req("background", 5, priority=10))
    s.add_request(_req("urgent", 8, start=20, priority=0))
    out = s.schedule()
    assert list(out.num_scheduled_tokens) == ["urgent", "background"]
    _run(s, out)  # 2 blocks each, none free: "urgent" (9 tokens) needs a third, "background" (6) does not
    s.running.reverse()  # "background" runs first: it is scheduled before "urgent" finds no block
    out = s.schedule()
    # The least urgent goes though it was scheduled already: its chunk is withdrawn, its tokens given back.
    assert out.preempted_request_ids == ["background"] and list(out.num_scheduled_tokens) == ["urgent"]
    assert s.waiting[0].request_id == "background" and s.requests["background"].num_computed_tokens == 0
    s.add_request(_req("later", 3, start=60, priority=10))
    assert [r.request_id for r in s.waiting] == ["background", "later"]  # it keeps its arrival


def test_finish_frees_blocks_and_reports_the_id():
    s = _sched()
    s.add_request(_req("a", 5))
    _run(s, s.schedule())
    free_before = s.kv.num_free_blocks
    s.finish_request("a", RequestStatus.FINISHED_ABORTED)
    assert s.kv.num_free_blocks == free_before + 2
    assert s.schedule().finished_request_ids == ["a"]
    assert not s.has_unfinished()


def test_abort_while_waiting_is_never_scheduled():
    s = _sched(max_seqs=1)
    s.add_request(_req("a", 3))
    s.add_request(_req("b", 3, start=10))
    s.schedule()
    s.finish_request("b", RequestStatus.FINISHED_ABORTED)
    assert "b" not in {x.request_id for _ in range(3) for x in s.schedule().scheduled}


def test_prefix_cache_queries_count_each_prompt_once():
    """A waiting request that fails to fit is looked up again next step, but counted only on admission."""
    s = _sched(num_blocks=5, block_size=4, budget=100)
    s.add_request(Request("a", list(range(12)), SamplingParams(max_tokens=8), cache_key=""))
    s.add_request(Request("b", list(range(40, 52)), SamplingParams(max_tokens=8), cache_key=""))
    _run(s, s.schedule())  # a takes 3 of 4 blocks; b cannot fit
    _run(s, s.schedule())
    assert s.kv.prefix_queries == 12
    s.finish_request("a", RequestStatus.FINISHED_STOPPED)
    _run(s, s.schedule())  # now b is admitted
    assert s.kv.prefix_queries == 24 and s.kv.prefix_hits == 0


def test_prompt_scoring_is_spread_over_steps_within_the_scoring_budget():
    """prompt_logprobs: each scored prompt token is a row of logits over the whole vocabulary; a
    step scores at most max_scored_tokens of them, while other requests take the rest of the budget."""
    s = _sched(num_blocks=256, max_seqs=8, budget=200)
    assert s.max_scored_tokens == 32  # no vocabulary given: the rows the step profile holds
    scored = [Request(f"s{i}", list(range(100 * i, 100 * i + 50)), SamplingParams(max_tokens=2, prompt_logprobs=1),
                      cache_key=None, scores_prompt=True) for i in range(2)]
    for r in scored:
        s.add_request(r)
    s.add_request(_req("plain", 60, start=900))
    rows = {r.request_id: 0 for r in scored}
    for _ in range(10):
        out = s.schedule()
        assert sum(x.prompt_logits for x in out.scheduled) <= s.max_scored_tokens
        assert sum(len(x.token_ids) for x in out.scheduled if x.prompt_logits) <= s.max_scored_tokens
        for x in out.scheduled:
            if x.request_id in rows:
                assert x.prompt_logits == max(0, min(x.start_position + len(x.token_ids), 49) - x.start_position)
                rows[x.request_id] += x.prompt_logits
        if any(x.request_id == "plain" for x in out.scheduled):
            assert out.num_scheduled_tokens.get("plain") in (60, 1)  # never held back by the scoring budget
        _run(s, out)
        for r in scored:
            if r.num_computed_tokens >= 49:
                r.scores_prompt = False  # the engine does this once every row is scored
    assert rows == {"s0": 49, "s1": 49}
