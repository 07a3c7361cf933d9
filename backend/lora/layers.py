"""The wrapped projections: the base module (whatever it is: nn.Linear, the CPU's packed or grid
linears, the int8/int4 ones) runs first, then each of its targets adds its rows' LoRA products.

A fused projection gets its segments: qkv_proj's outputs are q, then k, then v, so a q_proj
adapter writes only the first q columns; gate_up_proj's are gate then up. Wrapping happens from
outside the model's forward code (which calls `self.qkv_proj(h)` as before).
"""
from __future__ import annotations

import torch
from torch import nn

from kvserve.backend.lora.slots import LoRASlots, TargetGroups
from kvserve.kernels import cpu_native
from kvserve.kernels.lora_sgmv import lora_torch, lora_triton


class LoRAProjection(nn.Module):
    def __init__(self, base: nn.Module, slots: LoRASlots, layer: int, segments: list[tuple[str, int]]) -> None:
        super().__init__()
        self.base = base
        self.layer = layer
        self.segments = segments  # (target, first output column)
        # Not a submodule: the slots are shared by every layer, and the stacks are not parameters.
        object.__setattr__(self, "slots", slots)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        step = self.slots.step
        if step is None:
            return y
        x2, y2 = x.reshape(-1, x.shape[-1]), y.view(-1, y.shape[-1])
        for target, offset in self.segments:
            groups = step.get(target)
            if groups is not None:
                self._add(x2, y2, target, offset, groups)
        return y

    def _add(self, x: torch.Tensor, y: torch.Tensor, target: str, offset: int, g: TargetGroups) -> None:
        s = self.slots
        a, bt = s.a[target][self.layer], s.bt[target][self.layer]
        if x.device.type == "cuda":
            lora_triton(x, y, a, bt, s.scales, s.ranks[target], g.order, g.row_slots, offset)
        elif not cpu_native.lora(x, y, a, bt, s.scales, s.ranks[target], g.order, g.group_starts, g.group_slots,
                                 offset):
            lora_torch(x, y, a, bt, s.scales, s.ranks_list[target], g.order, g.starts, g.slots, offset)


def wrap_model(model: nn.Module, slots: LoRASlots) -> None:
    """Wrap every decoder layer's projections (Llama-family and Gemma 3 layouts) in place."""
    q, kv = slots.shapes.shapes["q_proj"][1], slots.shapes.shapes["k_proj"][1]
    inter = slots.shapes.shapes["gate_proj"][1]
    plan = {"qkv_proj": [("q_proj", 0), ("k_proj", q), ("v_proj", q + kv)], "o_proj": [("o_proj", 0)],
            "gate_up_proj": [("gate_proj", 0), ("up_proj", inter)], "down_proj": [("down_proj", 0)]}
    for i, layer in enumerate(model.layers):
        for name, segments in plan.items():
            base = getattr(layer, name)
            if isinstance(base, LoRAProjection):
                continue
            setattr(layer, name, LoRAProjection(base, slots, i, segments))
