"""The device's adapter slots: `max_loras` adapters resident at once, stacked per target, LRU-replaced.

Per target and layer, the slots' weights are one stack each (the layout kernels/lora_sgmv.py
reads), padded to max_lora_rank with zero rows::

    a[target]  [L, S, R, in]    slot s of layer l: its lora_A, rows past its rank zero
    bt[target] [L, S, R, out]   its lora_B transposed: one row is `out` contiguous outputs

A slot is chosen for an adapter when a step first needs it: a free one, else the least
recently used slot whose adapter is not in this step. The scheduler admits at most max_loras
distinct adapters among the running requests, so a step always finds room, and an adapter a
scheduled request runs with is never replaced during its step. The weights come from the
engine's registry, which keeps them on the CPU while any request holds the adapter, so a slot
replaced between steps is refilled from there, never from disk under a running request.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch

from kvserve.backend.lora.adapter import TARGETS, LoRAAdapter, TargetShapes


@dataclass(slots=True)
class TargetGroups:
    """One target's rows of this step, grouped by slot (kernels/lora_sgmv.py's arguments)."""
    order: torch.Tensor         # int64 [M] row indices, by group
    group_starts: torch.Tensor  # int64 [G + 1] (on the CPU for the native kernel)
    group_slots: torch.Tensor   # int64 [G]
    row_slots: torch.Tensor     # int64 [M] each row's slot (the Triton kernels' form)
    starts: list[int]
    slots: list[int]


class LoRASlots:
    def __init__(self, shapes: TargetShapes, max_loras: int, max_rank: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.shapes, self.num_slots, self.max_rank = shapes, max_loras, max_rank
        self.device, self.dtype = device, dtype
        layers = shapes.num_layers
        self.a = {t: torch.zeros(layers, max_loras, max_rank, fan_in, dtype=dtype, device=device)
                  for t, (fan_in, _) in shapes.shapes.items()}
        self.bt = {t: torch.zeros(layers, max_loras, max_rank, fan_out, dtype=dtype, device=device)
                   for t, (_, fan_out) in shapes.shapes.items()}
        self.scales = torch.zeros(max_loras, dtype=torch.float32, device=device)
        self.ranks = {t: torch.zeros(max_loras, dtype=torch.int64, device=device) for t in shapes.shapes}
        self.ranks_list = {t: [0] * max_loras for t in shapes.shapes}  # `ranks` as lists (the torch path)
        # lora_int_id -> (slot, the adapter object loaded there), least recently used first.
        self._resident: OrderedDict[int, tuple[int, LoRAAdapter]] = OrderedDict()
        self._free = list(range(max_loras - 1, -1, -1))
        self.num_loads = 0
        # This step's groups per target (None: no row runs an adapter); the wrapped projections read it.
        self.step: dict[str, TargetGroups] | None = None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.a.values(), *self.bt.values()))

    def resident_ids(self) -> list[int]:
        """The resident adapters' ids, least recently used first."""
        return list(self._resident)

    def slot_of(self, lora_id: int) -> int | None:
        held = self._resident.get(lora_id)
        return None if held is None else held[0]

    def _slot_for(self, adapter: LoRAAdapter, needed: set[int]) -> int:
        lora_id = adapter.request.lora_int_id
        held = self._resident.get(lora_id)
        if held is not None and held[1] is adapter:
            self._resident.move_to_end(lora_id)
            return held[0]
        if held is not None:  # the id now names other weights (removed and added again): reload in place
            slot = held[0]
            del self._resident[lora_id]
        elif self._free:
            slot = self._free.pop()
        else:
            victim = next((i for i in self._resident if i not in needed), None)
            if victim is None:
                raise RuntimeError(f"LoRA: a step needs more than max_loras={self.num_slots} adapters "
                                   f"(the scheduler bounds them)")
            slot = self._resident.pop(victim)[0]
        self._load(slot, adapter)
        self._resident[lora_id] = (slot, adapter)
        return slot

    @torch.no_grad()
    def _load(self, slot: int, adapter: LoRAAdapter) -> None:
        r = adapter.rank
        for target in self.shapes.shapes:
            present = target in adapter.targets
            self.ranks_list[target][slot] = r if present else 0
            self.a[target][:, slot].zero_()
            self.bt[target][:, slot].zero_()
            if not present:
                continue
            for layer in range(self.shapes.num_layers):
                a, b = adapter.weights[(layer, target)]
                self.a[target][layer, slot, :r].copy_(a)
                self.bt[target][layer, slot, :r].copy_(b.T)
        for target, ranks in self.ranks_list.items():
            self.ranks[target].copy_(torch.tensor(ranks, dtype=torch.int64))
        self.scales[slot] = adapter.scaling
        self.num_loads += 1

    def prepare(self, lora_ids: list[int], q_lens: list[int], lookup: Callable[[int], LoRAAdapter]) -> None:
        """Set this step's rows: request i (q_lens[i] consecutive rows of the flat batch) runs adapter
        lora_ids[i] (0: the base model). `lookup` gives the registry's loaded adapter of an id."""
        needed = {i for i in lora_ids if i}
        if not needed:
            self.step = None
            return
        if len(needed) > self.num_slots:
            raise RuntimeError(f"LoRA: {len(needed)} adapters in one step, more than max_loras={self.num_slots}")
        adapters = {i: lookup(i) for i in needed}
        slot_of = {i: self._slot_for(adapters[i], needed) for i in needed}
        rows_of: dict[int, list[int]] = {}
        start = 0
        for lora_id, n in zip(lora_ids, q_lens):
            if lora_id:
                rows_of.setdefault(slot_of[lora_id], []).extend(range(start, start + n))
            start += n
        step: dict[str, TargetGroups] = {}
        targets_of = {slot_of[i]: adapters[i].targets for i in needed}
        # Targets whose adapters are the same slots share one set of index tensors: built once
        # per step, not once per target (usually every target of a step has the same slots).
        built: dict[tuple[int, ...], TargetGroups] = {}
        for target in TARGETS:
            if target not in self.shapes.shapes:
                continue
            slots = tuple(slot for slot in sorted(rows_of) if target in targets_of[slot])
            if slots:
                if slots not in built:
                    built[slots] = self._groups(slots, rows_of)
                step[target] = built[slots]
        self.step = step or None

    def _groups(self, slots: tuple[int, ...], rows_of: dict[int, list[int]]) -> TargetGroups:
        order, starts, row_slots = [], [0], []
        for slot in slots:
            order += rows_of[slot]
            row_slots += [slot] * len(rows_of[slot])
            starts.append(len(order))
        return TargetGroups(torch.tensor(order, dtype=torch.int64, device=self.device),
                            torch.tensor(starts, dtype=torch.int64), torch.tensor(slots, dtype=torch.int64),
                            torch.tensor(row_slots, dtype=torch.int64, device=self.device), starts, list(slots))
