"""The hot-path operations of the decoder, behind one interface.

`TorchOps` is the CPU path (and the reference); `TritonOps` routes the same
calls through the Triton kernels in `kvserve.kernels`. The model calls only
these, so choosing a backend never touches the model code.

Every layer of a step passes the same metadata, slot mapping and positions, so
`TorchOps` derives what it needs from them once per step (attention's slot ids
and masks, the valid slots, the rotary angles) and reuses it in every layer:
it keeps the last step's plans and recognises the step by tensor identity.
"""
from __future__ import annotations

import torch

from kvserve.kernels import cpu_native
from kvserve.kernels.cpu_paged_attention import KVStorePlan, PagedAttentionPlan
from kvserve.kernels.rms_norm import rms_norm_torch
from kvserve.kernels.rotary import rotary_embedding_torch, rotate_torch
from kvserve.kernels.silu_and_mul import gelu_and_mul_torch, silu_and_mul_torch


class TorchOps:
    name = "torch"

    def __init__(self) -> None:
        cpu_native.available()  # build (or find the cached) native kernel now, not at the first decode step
        # This step's plans, by the identity of the metadata they were made from (one per KV cache
        # group), each with one attention plan per window its layers use (None: full attention).
        self._attention: dict[int, tuple[object, dict[int | None, PagedAttentionPlan]]] = {}
        self._store: dict[int, tuple[torch.Tensor, KVStorePlan]] = {}
        self._rotary: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def store_kv(self, key, value, key_cache, value_cache, slot_mapping) -> None:
        entry = self._store.get(id(slot_mapping))
        if entry is None or entry[0] is not slot_mapping:
            entry = _remember(self._store, slot_mapping, KVStorePlan(slot_mapping))
        entry[1].store(key, value, key_cache, value_cache)

    def attention(self, query, key_cache, value_cache, meta, scale: float, window: int | None = None) -> torch.Tensor:
        entry = self._attention.get(id(meta))
        if entry is None or entry[0] is not meta:
            entry = _remember(self._attention, meta, {})
        plans = entry[1]
        plan = plans.get(window)
        if plan is None:
            # Prompt chunks may attend as decode rows only where the native kernel reads them.
            rows_head_dim = key_cache.shape[3] if cpu_native.supports(query, key_cache) else None
            plan = plans[window] = PagedAttentionPlan(meta.block_tables, meta.seq_lens, meta.query_start_loc,
                                                      key_cache.shape[1], meta.decode_only, key_cache.shape[0],
                                                      window, rows_head_dim)
        return plan.run(query, key_cache, value_cache, scale)

    def rms_norm(self, x, weight, eps, residual=None):
        if x.dim() == 2:  # rows: the decoder's [T, hidden], or per-head norms as [T * heads, head_dim]
            fused = cpu_native.rms_norm(x, weight, eps, residual)
            if fused is not None:
                return fused
        return rms_norm_torch(x, weight, eps, residual)

    def silu_and_mul(self, x):
        fused = cpu_native.silu_and_mul(x)
        return fused if fused is not None else silu_and_mul_torch(x)

    def gelu_and_mul(self, x, approximate: str):
        fused = cpu_native.gelu_tanh_and_mul(x) if approximate == "tanh" else None
        return fused if fused is not None else gelu_and_mul_torch(x, approximate)

    def rotary(self, positions, query, key, cos_sin_cache, is_neox: bool) -> None:
        r = self._rotary
        if r is None or r[0] is not positions or r[1] is not cos_sin_cache:
            cos, sin = (half.contiguous() for half in cos_sin_cache[positions.long()].float().chunk(2, dim=-1))
            r = self._rotary = (positions, cos_sin_cache, cos, sin)
        for x in (query, key):
            if not cpu_native.rotary(x, r[2], r[3], is_neox):
                rotate_torch(x, None, r[2][:, None, :], r[3][:, None, :], is_neox)


def _remember(plans: dict, key_object, plan):
    """Keep plan for key_object; a new step's objects push the old step's out (a step has at most
    a few KV cache groups, so a small bound never drops a plan the step still uses)."""
    if len(plans) >= 16:
        plans.clear()
    entry = plans[id(key_object)] = (key_object, plan)
    return entry


def select_ops(attention_backend: str, device: torch.device):
    """`auto` takes the Triton kernels on CUDA and torch elsewhere."""
    choice = attention_backend
    if choice == "auto":
        choice = "triton" if device.type == "cuda" else "torch"
    if choice == "torch":
        return TorchOps()
    try:
        from kvserve.kernels.triton_ops import TritonOps
    except ImportError as exc:  # triton missing: say so instead of silently falling back
        raise ValueError(f"attention_backend: 'triton' needs the triton package ({exc})") from None
    return TritonOps()
