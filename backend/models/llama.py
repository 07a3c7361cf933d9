"""Llama-family decoder (Llama, Mistral, Qwen2 with qkv bias, Qwen3 with q/k norm) over a paged KV cache.

The batch is flat: T tokens of all scheduled requests concatenated, no padding.
Attention, cache store, norms and rotary go through `ops` (torch or Triton), so
this file holds only the model's arithmetic.

Under tensor parallelism (`shard` and `group` given, worker/parallel/) each rank holds its heads,
its MLP columns and its vocabulary rows (worker/parallel/weight_shard.py cuts them at load); o_proj's and
down_proj's partial sums are all-reduced, the embedding rows outside this rank's vocabulary are
zero before their all-reduce, and the logits are gathered along the vocabulary. Without them the
arithmetic is the single-process one, untouched.

Under pipeline parallelism (`stage` given: a worker/parallel/stage_plan.StagePlan) the model holds
layers [stage.start, stage.end) only, the embedding on the first stage (and on the last when the
logits reuse it), the final norm and the logits on the last; `forward_stage` runs that part: ids
or the previous stage's (hidden, residual) in, (hidden, residual) or logits out.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.backend.models.arch_config import ArchConfig
from kvserve.backend.models.rope import build_cos_sin_cache


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ArchConfig, layer: int, shard=None, group=None) -> None:
        super().__init__()
        self.window = cfg.layer_window(layer)
        self.num_heads = cfg.num_attention_heads if shard is None else shard.num_heads
        self.num_kv_heads = cfg.num_key_value_heads if shard is None else shard.num_kv_heads
        intermediate = cfg.intermediate_size if shard is None else shard.intermediate
        self.group = group
        self.head_dim = cfg.head_dim
        self.eps = cfg.rms_norm_eps
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_size, self.kv_size = q_size, kv_size
        # q, k and v (and gate and up) are fused into one matmul each; the loader splices them.
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, cfg.hidden_size, bias=False)
        self.input_layernorm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.post_attention_layernorm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.q_norm = nn.Parameter(torch.ones(self.head_dim)) if cfg.qk_norm else None
        self.k_norm = nn.Parameter(torch.ones(self.head_dim)) if cfg.qk_norm else None

    def forward(self, ops, x, residual, positions, cos_sin_cache, kv_cache, meta, scale):
        if residual is None:
            h, residual = ops.rms_norm(x, self.input_layernorm, self.eps), x
        else:
            h, residual = ops.rms_norm(x, self.input_layernorm, self.eps, residual)
        qkv = self.qkv_proj(h)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q = ops.rms_norm(q.contiguous(), self.q_norm, self.eps)
            k = ops.rms_norm(k.contiguous(), self.k_norm, self.eps)
        else:
            q, k = q.contiguous(), k.contiguous()
        v = v.contiguous()
        ops.rotary(positions, q, k, cos_sin_cache, True)
        key_cache, value_cache = kv_cache
        ops.store_kv(k, v, key_cache, value_cache, meta.slot_mapping)
        attn = ops.attention(q, key_cache, value_cache, meta, scale, window=self.window)
        h = self.o_proj(attn.reshape(-1, self.q_size))
        if self.group is not None:
            self.group.all_reduce(h)
        h, residual = ops.rms_norm(h, self.post_attention_layernorm, self.eps, residual)
        out = self.down_proj(ops.silu_and_mul(self.gate_up_proj(h)))
        if self.group is not None:
            self.group.all_reduce(out)
        return out, residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ArchConfig, max_position: int, shard=None, group=None, stage=None) -> None:
        super().__init__()
        self.cfg = cfg
        self.shard, self.group = shard, group
        # The layers held here (all of them without a pipeline stage); layer i is self.layers[i - first_layer].
        self.first_layer, end = (0, cfg.num_hidden_layers) if stage is None else (stage.start, stage.end)
        self.is_first_stage = stage is None or stage.first
        self.is_last_stage = stage is None or stage.last
        vocab_rows = cfg.vocab_size if shard is None else shard.vocab_rows
        needs_embedding = self.is_first_stage or (self.is_last_stage and cfg.tie_word_embeddings)
        self.embed_tokens = nn.Embedding(vocab_rows, cfg.hidden_size) if needs_embedding else None
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, shard, group) for i in range(self.first_layer, end))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size)) if self.is_last_stage else None
        self.lm_head = (None if cfg.tie_word_embeddings or not self.is_last_stage
                        else nn.Parameter(torch.empty(vocab_rows, cfg.hidden_size)))
        # A replacement for the logits matmul over `lm_head` (or the tied embedding), set by
        # models/quantize.py; parameters and loaders are unchanged by it.
        self.logits_proj: nn.Module | None = None
        # The decoder stack of decode steps as one native call (worker/native_decode.py), set by the
        # model runner where it applies; None: the layers below run one operation at a time.
        self.native_decode = None
        self.scale = cfg.head_dim ** -0.5
        self.max_position = max_position
        self.build_rotary()

    def build_rotary(self, device: torch.device | None = None) -> None:
        """The rotary table, float32 whatever the weights' dtype (rebuilt after loading: the model is
        first made on the meta device)."""
        self.cos_sin_cache = build_cos_sin_cache(self.cfg.head_dim, self.cfg.rope_theta, self.max_position,
                                                 self.cfg.rope_scaling).to(device)

    @torch.inference_mode()
    def forward(self, ops, input_ids, positions, kv_caches, meta, logits_indices) -> torch.Tensor:
        return self.forward_stage(ops, input_ids, None, positions, kv_caches, meta, logits_indices)

    @torch.inference_mode()
    def forward_stage(self, ops, inputs, residual, positions, kv_caches, meta, logits_indices):
        """This stage's part of the forward: `inputs` are token ids on the first stage, else the
        previous stage's hidden states (with its `residual`). Returns the logits on the last stage,
        else (hidden, residual) for the next. Without a stage: the whole model, ids to logits."""
        if self.is_first_stage:
            x = self.embed_tokens(inputs) if self.group is None else self._embed_vocab_parallel(inputs)
        else:
            x = inputs
        metas = meta if isinstance(meta, list) else [meta] * len(self.layers)  # one per layer: KV groups
        stack = None if self.native_decode is None else self.native_decode.run(x, positions, metas)
        if stack is not None:
            x, residual = stack
        for layer, kv_cache, meta in zip(self.layers if stack is None else (), kv_caches, metas):
            x, residual = layer(ops, x, residual, positions, self.cos_sin_cache, kv_cache, meta, self.scale)
        if not self.is_last_stage:
            return x, residual
        # Only the rows that sample need the final norm and the (large) vocabulary projection.
        if logits_indices.numel() != x.shape[0]:  # else every row samples: the indices, increasing, are all rows
            x, residual = x[logits_indices], residual[logits_indices]
        h, _ = ops.rms_norm(x, self.norm, self.cfg.rms_norm_eps, residual)
        if self.logits_proj is not None:
            logits = self.logits_proj(h).float()
        else:
            weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head
            logits = F.linear(h, weight).float()
        if self.group is None:
            return logits
        return self.group.all_gather_last(logits)[:, :self.cfg.vocab_size]

    def _embed_vocab_parallel(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Each rank looks up the ids in its vocabulary rows, zeros the others; the sum is the embedding."""
        local = input_ids - self.shard.vocab_start
        outside = (local < 0) | (local >= self.shard.vocab_rows)
        x = self.embed_tokens(local.masked_fill(outside, 0)).masked_fill(outside[:, None], 0.0)
        return self.group.all_reduce(x)
