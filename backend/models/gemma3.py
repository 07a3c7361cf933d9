"""Gemma 3 text decoder (Gemma3ForCausalLM) over the paged KV cache.

What sets it apart from the Llama family, each checked against transformers:
- the embedding is scaled by sqrt(hidden_size);
- RMSNorm multiplies by (1 + w): checkpoints store w centred on zero. `finalize_weights` turns
  each norm's w into 1 + w once after loading, so the shared rms_norm op serves as it is;
- four norms per layer: before and after attention, before and after the MLP; the post-norms
  apply to the branch's output before it joins the residual;
- q and k are normed per head, and the query scale is query_pre_attn_scalar ** -0.5;
- the MLP is GeGLU with tanh GELU;
- sliding layers attend over the last `sliding_window` positions with their own rope theta;
  every sixth layer sees the whole context with the global theta.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.backend.models.arch_config import ArchConfig
from kvserve.backend.models.rope import build_cos_sin_cache

_ACTIVATIONS = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ArchConfig, layer: int) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.window = cfg.layer_window(layer)
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        hidden = cfg.hidden_size
        self.input_layernorm = nn.Parameter(torch.zeros(hidden))
        self.post_attention_layernorm = nn.Parameter(torch.zeros(hidden))
        self.pre_feedforward_layernorm = nn.Parameter(torch.zeros(hidden))
        self.post_feedforward_layernorm = nn.Parameter(torch.zeros(hidden))
        self.q_norm = nn.Parameter(torch.zeros(self.head_dim))
        self.k_norm = nn.Parameter(torch.zeros(self.head_dim))
        if cfg.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"model: Gemma 3 activation {cfg.hidden_act!r} is not supported "
                             f"(supported: {', '.join(_ACTIVATIONS)})")
        self.approximate = _ACTIVATIONS[cfg.hidden_act]

    def norms(self) -> list[nn.Parameter]:
        return [self.input_layernorm, self.post_attention_layernorm, self.pre_feedforward_layernorm,
                self.post_feedforward_layernorm, self.q_norm, self.k_norm]

    def forward(self, ops, x, residual, positions, cos_sin_cache, kv_cache, meta, scale):
        # (x, residual) as the Llama layers pass them: the layer's input is x + residual.
        if residual is None:
            h, residual = ops.rms_norm(x, self.input_layernorm, self.eps), x
        else:
            h, residual = ops.rms_norm(x, self.input_layernorm, self.eps, residual)
        q, k, v = self.qkv_proj(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        # Per head, as rows of head_dim: the 2-D form the native CPU norm takes (one call, not five ops).
        q = ops.rms_norm(q.reshape(-1, self.head_dim), self.q_norm, self.eps).view(-1, self.num_heads, self.head_dim)
        k = ops.rms_norm(k.reshape(-1, self.head_dim), self.k_norm, self.eps).view(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim).contiguous()
        ops.rotary(positions, q, k, cos_sin_cache, True)
        key_cache, value_cache = kv_cache
        ops.store_kv(k, v, key_cache, value_cache, meta.slot_mapping)
        attn = ops.attention(q, key_cache, value_cache, meta, scale, window=self.window)
        h = ops.rms_norm(self.o_proj(attn.reshape(-1, self.q_size)), self.post_attention_layernorm, self.eps)
        h, residual = ops.rms_norm(h, self.pre_feedforward_layernorm, self.eps, residual)
        h = self.down_proj(ops.gelu_and_mul(self.gate_up_proj(h), self.approximate))
        return ops.rms_norm(h, self.post_feedforward_layernorm, self.eps), residual


class Gemma3ForCausalLM(nn.Module):
    def __init__(self, cfg: ArchConfig, max_position: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.max_position = max_position
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = nn.Parameter(torch.zeros(cfg.hidden_size))
        self.lm_head = (None if cfg.tie_word_embeddings
                        else nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size)))
        self.logits_proj: nn.Module | None = None  # as LlamaForCausalLM's (models/quantize.py)
        self.native_decode = None  # as LlamaForCausalLM's (worker/native_decode.py)
        self.scale = cfg.attention_scale
        self.build_rotary()

    def build_rotary(self, device: torch.device | None = None) -> None:
        """The two rotary tables (global theta for full layers, local for sliding ones), float32."""
        cfg = self.cfg
        self.cos_sin_cache = build_cos_sin_cache(cfg.head_dim, cfg.rope_theta, self.max_position,
                                                 cfg.rope_scaling).to(device)
        self.local_cos_sin_cache = build_cos_sin_cache(cfg.head_dim, cfg.rope_local_theta or cfg.rope_theta,
                                                       self.max_position, None).to(device)

    @torch.no_grad()
    def finalize_weights(self) -> None:
        """Checkpoint norms are w with the multiplier 1 + w: store 1 + w, computed as transformers does."""
        for p in [self.norm, *(n for layer in self.layers for n in layer.norms())]:
            p.copy_(1.0 + p.float())

    @torch.inference_mode()
    def forward(self, ops, input_ids, positions, kv_caches, meta, logits_indices) -> torch.Tensor:
        # transformers multiplies by the scale held as a tensor of the weights' dtype.
        x = self.embed_tokens(input_ids)
        x = x * torch.tensor(self.cfg.hidden_size ** 0.5, dtype=x.dtype)
        residual = None
        metas = meta if isinstance(meta, list) else [meta] * len(self.layers)  # one per layer: KV groups
        stack = None if self.native_decode is None else self.native_decode.run(x, positions, metas)
        if stack is not None:
            x, residual = stack
        for layer, kv_cache, meta in zip(self.layers if stack is None else (), kv_caches, metas):
            table = self.cos_sin_cache if layer.window is None else self.local_cos_sin_cache
            x, residual = layer(ops, x, residual, positions, table, kv_cache, meta, self.scale)
        if logits_indices.numel() != x.shape[0]:  # else every row samples: the indices, increasing, are all rows
            x, residual = x[logits_indices], residual[logits_indices]
        h, _ = ops.rms_norm(x, self.norm, self.cfg.rms_norm_eps, residual)
        if self.logits_proj is not None:
            return self.logits_proj(h).float()
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head
        return F.linear(h, weight).float()
