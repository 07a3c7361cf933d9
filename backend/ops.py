"""The four hot-path operations of the decoder, behind one interface.

`TorchOps` is the CPU path (and the reference); `TritonOps` routes the same
calls through the Triton kernels in `kvserve.kernels`. The model calls only
these, so choosing a backend never touches the model code.
"""
from __future__ import annotations

import torch

from kvserve.kernels.kv_cache_store import store_kv_cache_torch
from kvserve.kernels.paged_attention_ref import paged_decode_attention_torch, paged_prefill_attention_torch
from kvserve.kernels.rms_norm import rms_norm_torch
from kvserve.kernels.rotary import rotary_embedding_torch


class TorchOps:
    name = "torch"

    def store_kv(self, key, value, key_cache, value_cache, slot_mapping) -> None:
        store_kv_cache_torch(key, value, key_cache, value_cache, slot_mapping)

    def attention(self, query, key_cache, value_cache, meta, scale: float) -> torch.Tensor:
        if meta.decode_only:
            return paged_decode_attention_torch(query, key_cache, value_cache, meta.block_tables,
                                                meta.seq_lens, scale)
        return paged_prefill_attention_torch(query, key_cache, value_cache, meta.block_tables,
                                             meta.seq_lens, meta.query_start_loc, scale)

    def rms_norm(self, x, weight, eps, residual=None):
        return rms_norm_torch(x, weight, eps, residual)

    def rotary(self, positions, query, key, cos_sin_cache, is_neox: bool) -> None:
        rotary_embedding_torch(positions, query, key, cos_sin_cache, is_neox)


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
