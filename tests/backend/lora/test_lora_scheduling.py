"""LoRA and the step: the scheduler never runs more than max_loras distinct adapters at once (and
starves none), the device slots are replaced least recently used and never under a step that needs
them, and an adapter evicted or unloaded while requests hold it stays loaded until they end."""
from __future__ import annotations

import random

import pytest
import torch

from kvserve.backend.engine.request import Request, RequestStatus
from kvserve.backend.engine.sampling_params import SamplingParams
from kvserve.backend.engine.scheduler import Scheduler
from kvserve.backend.kv_cache.manager import KVCacheManager
from kvserve.backend.lora import LoRAAdapter, LoRAError, LoRARegistry, LoRARequest, LoRASlots, TargetShapes


def _sched(max_loras: int, max_seqs: int = 8, budget: int = 64) -> Scheduler:
    return Scheduler(KVCacheManager(256, 4, True), max_seqs, budget, max_loras=max_loras)


def _req(rid: str, lora_id: int, n: int = 5, max_tokens: int = 3) -> Request:
    return Request(rid, [lora_id * 100 + i for i in range(n)], SamplingParams(max_tokens=max_tokens),
                   cache_key="", lora_int_id=lora_id, lora_name=f"l{lora_id}" if lora_id else None)


def _step(s: Scheduler) -> list[int]:
    """One step as the engine runs it; returns the adapter ids scheduled and ends finished requests."""
    out = s.schedule()
    s.update_from_output(out, {x.request_id: 7 for x in out.scheduled if x.samples})
    for x in out.scheduled:
        req = s.requests[x.request_id]
        if len(req.output_token_ids) >= req.sampling_params.max_tokens:
            s.finish_request(x.request_id, RequestStatus.FINISHED_LENGTH)
    return [x.lora_int_id for x in out.scheduled]


def test_a_step_holds_at_most_max_loras_adapters_and_base_requests_pass_a_blocked_one() -> None:
    s = _sched(max_loras=2)
    for rid, lora in [("a1", 1), ("b1", 2), ("c1", 3), ("base", 0), ("a2", 1), ("c2", 3)]:
        s.add_request(_req(rid, lora))
    out = s.schedule()
    scheduled = {x.request_id: x.lora_int_id for x in out.scheduled}
    # c1 finds no slot; a2 (adapter 1, running) waits behind it too, so adapter 3 is next in line.
    assert scheduled == {"a1": 1, "b1": 2, "base": 0}
    assert [r.request_id for r in s.waiting] == ["c1", "a2", "c2"]
    s.update_from_output(out, {x.request_id: 7 for x in out.scheduled})
    # While adapters 1 and 2 run, nothing for a third one is admitted.
    assert {x.lora_int_id for x in s.schedule().scheduled} <= {0, 1, 2}
    for rid in ("a1", "b1"):
        s.finish_request(rid, RequestStatus.FINISHED_LENGTH)
    out = s.schedule()
    assert {x.request_id for x in out.scheduled} >= {"c1", "a2", "c2"}
    assert len({x.lora_int_id for x in out.scheduled} - {0}) == 2


@pytest.mark.parametrize("max_loras", [1, 2, 3])
def test_random_traffic_never_exceeds_max_loras_and_every_request_ends(max_loras: int) -> None:
    rng = random.Random(max_loras)
    s = _sched(max_loras=max_loras, max_seqs=6, budget=24)
    pending = [_req(f"r{i}", rng.choice([0, 0, 1, 2, 3, 4, 5]), n=rng.randint(1, 12), max_tokens=rng.randint(1, 6))
               for i in range(120)]
    for step in range(2000):
        for _ in range(rng.randint(0, 2)):
            if pending:
                s.add_request(pending.pop())
        ids = _step(s)
        assert len(set(ids) - {0}) <= max_loras, (step, ids)
        assert len({r.lora_int_id for r in s.running} - {0}) <= max_loras
        if not pending and not s.has_unfinished():
            break
    assert not pending and not s.has_unfinished(), "a request starved"
    assert s.kv.num_free_blocks == s.kv.num_usable_blocks


# ---- the device slots ------------------------------------------------------------------------

SHAPES = TargetShapes(2, {"q_proj": (8, 8), "k_proj": (8, 4), "v_proj": (8, 4), "o_proj": (8, 8),
                          "gate_proj": (8, 12), "up_proj": (8, 12), "down_proj": (12, 8)})


def _adapter(lora_id: int, rank: int = 2, targets=("q_proj", "down_proj")) -> LoRAAdapter:
    gen = torch.Generator().manual_seed(lora_id)
    weights = {(layer, t): (torch.randn(rank, SHAPES.shapes[t][0], generator=gen),
                            torch.randn(SHAPES.shapes[t][1], rank, generator=gen))
               for layer in range(SHAPES.num_layers) for t in targets}
    return LoRAAdapter(LoRARequest(f"l{lora_id}", lora_id, f"/adapters/{lora_id}"), rank, 0.5 * lora_id,
                       frozenset(targets), weights)


def _holds(slots: LoRASlots, slot: int, adapter: LoRAAdapter) -> bool:
    """The slot's stacks hold exactly this adapter's weights."""
    for (layer, target), (a, b) in adapter.weights.items():
        if not (torch.equal(slots.a[target][layer, slot, :adapter.rank], a)
                and torch.equal(slots.bt[target][layer, slot, :adapter.rank], b.T)):
            return False
    return float(slots.scales[slot]) == adapter.scaling


def _slot_of(slots: LoRASlots, lora_id: int) -> int:
    slot = slots.slot_of(lora_id)
    assert slot is not None, f"adapter {lora_id} is not resident"
    return slot


def test_slots_are_replaced_least_recently_used() -> None:
    adapters = {i: _adapter(i) for i in (1, 2, 3, 4)}
    slots = LoRASlots(SHAPES, max_loras=2, max_rank=4, device=torch.device("cpu"), dtype=torch.float32)
    for ids in ([1], [2], [1], [3]):  # 2 is the least recently used when 3 comes
        slots.prepare(ids, [1] * len(ids), adapters.__getitem__)
    assert sorted(slots.resident_ids()) == [1, 3] and slots.num_loads == 3
    assert _holds(slots, _slot_of(slots, 1), adapters[1]) and _holds(slots, _slot_of(slots, 3), adapters[3])
    slots.prepare([1, 0, 1], [2, 3, 1], adapters.__getitem__)  # a step with base rows: 1 stays, no load
    assert slots.num_loads == 3
    group = slots.step["q_proj"]
    assert group.order.tolist() == [0, 1, 5] and group.slots == [_slot_of(slots, 1)]
    slots.prepare([4], [1], adapters.__getitem__)  # now 3 is the least recently used
    assert sorted(slots.resident_ids()) == [1, 4]
    slots.prepare([0, 0], [1, 1], adapters.__getitem__)
    assert slots.step is None  # base rows only: the wrapped projections add nothing


def test_a_slot_this_step_needs_is_never_the_one_replaced() -> None:
    adapters = {i: _adapter(i) for i in (1, 2, 5)}
    slots = LoRASlots(SHAPES, max_loras=2, max_rank=4, device=torch.device("cpu"), dtype=torch.float32)
    slots.prepare([5], [1], adapters.__getitem__)
    slots.prepare([2], [1], adapters.__getitem__)
    five = _slot_of(slots, 5)
    # 5 is the least recently used, but this step runs it: 2 is replaced by 1, whichever comes first.
    slots.prepare([1, 5], [1, 1], adapters.__getitem__)
    assert sorted(slots.resident_ids()) == [1, 5] and _slot_of(slots, 5) == five
    assert _holds(slots, five, adapters[5]) and _holds(slots, _slot_of(slots, 1), adapters[1])
    with pytest.raises(RuntimeError, match="more than max_loras=2"):
        slots.prepare([1, 2, 5], [1, 1, 1], adapters.__getitem__)


def test_new_weights_under_an_old_id_are_reloaded_in_place() -> None:
    slots = LoRASlots(SHAPES, max_loras=2, max_rank=4, device=torch.device("cpu"), dtype=torch.float32)
    first, again = _adapter(1), _adapter(1, rank=3, targets=("q_proj",))
    slots.prepare([1], [1], lambda _: first)
    slot = _slot_of(slots, 1)
    slots.prepare([1], [1], lambda _: again)  # removed and added again from other files
    assert _slot_of(slots, 1) == slot and _holds(slots, slot, again)
    assert slots.ranks_list["down_proj"][slot] == 0 and not slots.a["down_proj"][:, slot].any()


# ---- the registry: evicted or unloaded under a running request ------------------------------

def _registry(capacity: int) -> tuple[LoRARegistry, list[str]]:
    reads: list[str] = []

    def load(lora: LoRARequest) -> LoRAAdapter:
        reads.append(lora.lora_name)
        return _adapter(lora.lora_int_id)

    return LoRARegistry(load, capacity), reads


def test_an_adapter_evicted_from_the_cpu_cache_while_pinned_keeps_its_weights() -> None:
    reg, reads = _registry(capacity=1)
    one, two = LoRARequest("l1", 1, "/a/1"), LoRARequest("l2", 2, "/a/2")
    reg.add(one)
    reg.pin(one)
    held = reg.pinned(1)
    reg.add(two)  # the cache holds one adapter: 1 leaves it, but a request holds it
    assert reg.pinned(1) is held and reads == ["l1", "l2"]
    reg.pin(one)  # another request for it: the pinned weights, not a second read
    assert reads == ["l1", "l2"]
    reg.unpin(1)
    assert reg.pinned(1) is held  # one request still runs with it
    reg.unpin(1)
    with pytest.raises(KeyError):
        reg.pinned(1)
    reg.pin(one)  # out of every cache now: read again
    assert reads == ["l1", "l2", "l1"] and reg.num_pinned() == 1


def test_an_adapter_unloaded_while_pinned_lives_until_its_requests_end() -> None:
    reg, _ = _registry(capacity=4)
    one = LoRARequest("l1", 1, "/a/1")
    reg.add(one)
    reg.pin(one)
    held = reg.pinned(1)
    reg.remove("l1")
    assert reg.pinned(1) is held  # the running request finishes with it
    with pytest.raises(LoRAError, match="not loaded") as info:
        reg.pin(one)  # a new request cannot name it any more
    assert info.value.not_found
    with pytest.raises(LoRAError, match="not loaded"):
        reg.resolve("l1")
    reg.unpin(1)
    assert reg.num_pinned() == 0
    with pytest.raises(KeyError):
        reg.pinned(1)


def test_targets_with_the_same_slots_share_one_set_of_index_tensors() -> None:
    adapters = {1: _adapter(1, targets=("q_proj", "down_proj")), 2: _adapter(2, targets=("q_proj", "o_proj"))}
    slots = LoRASlots(SHAPES, max_loras=2, max_rank=4, device=torch.device("cpu"), dtype=torch.float32)
    slots.prepare([2, 1, 0, 2], [2, 1, 1, 1], adapters.__getitem__)
    step = slots.step
    one, two = _slot_of(slots, 1), _slot_of(slots, 2)
    assert set(step) == {"q_proj", "down_proj", "o_proj"}
    rows = {one: [2], two: [0, 1, 4]}
    assert step["q_proj"].order.tolist() == [r for s in sorted(rows) for r in rows[s]]
    assert step["q_proj"].slots == sorted(rows)
    assert step["down_proj"].order.tolist() == [2] and step["down_proj"].slots == [one]
    assert step["o_proj"].order.tolist() == [0, 1, 4] and step["o_proj"].row_slots.tolist() == [two] * 3
    slots.prepare([2], [3], adapters.__getitem__)
    assert slots.step["q_proj"] is slots.step["o_proj"]  # the same slots: one set of tensors
