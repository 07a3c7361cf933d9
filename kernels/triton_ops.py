"""`TritonOps`: the decoder's hot-path operations through the Triton kernels.

Same methods and results as `kvserve.backend.worker.ops.TorchOps`, so the model never
knows which one it runs. Attention reads the sizes it needs for the launch
grid (`max_seq_len`, `max_query_len`) from the batch metadata instead of
syncing with the device.

Off-GPU the kernels run only under Triton's interpreter (TRITON_INTERPRET=1 set
before triton is first imported); that is for tests, not for serving.
"""
from __future__ import annotations

import torch

from kvserve.kernels.kv_cache_store import store_kv_cache_triton
from kvserve.kernels.paged_decode_attention import paged_decode_attention_triton
from kvserve.kernels.paged_prefill_attention import paged_prefill_attention_triton
from kvserve.kernels.rms_norm import rms_norm_triton
from kvserve.kernels.rotary import rotary_embedding_triton
from kvserve.kernels.silu_and_mul import gelu_and_mul_torch, silu_and_mul_triton


class TritonOps:
    name = "triton"

    def store_kv(self, key, value, key_cache, value_cache, slot_mapping) -> None:
        store_kv_cache_triton(key, value, key_cache, value_cache, slot_mapping)

    def attention(self, query, key_cache, value_cache, meta, scale: float, window: int | None = None) -> torch.Tensor:
        # The window goes to the kernels even when every context fits in it: which kernel variant
        # runs then depends on the layer, never on the step's lengths (as a captured graph needs).
        if meta.decode_only:
            return paged_decode_attention_triton(query, key_cache, value_cache, meta.block_tables, meta.seq_lens,
                                                 scale, max_seq_len=int(meta.max_seq_len), window=window)
        return paged_prefill_attention_triton(query, key_cache, value_cache, meta.block_tables, meta.seq_lens,
                                              meta.query_start_loc, scale, max_query_len=int(meta.max_query_len),
                                              max_seq_len=int(meta.max_seq_len), window=window)

    def rms_norm(self, x, weight, eps, residual=None):
        return rms_norm_triton(x, weight, eps, residual)

    def rotary(self, positions, query, key, cos_sin_cache, is_neox: bool) -> None:
        rotary_embedding_triton(positions, query, key, cos_sin_cache, is_neox)

    def silu_and_mul(self, x):
        return silu_and_mul_triton(x)

    def gelu_and_mul(self, x, approximate: str):
        return gelu_and_mul_torch(x, approximate)  # no Triton kernel yet: Gemma's MLP runs it in torch
