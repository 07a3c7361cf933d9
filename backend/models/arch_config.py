"""The decoder hyper-parameters read from a Hugging Face config.json: the Llama family and Gemma 3."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# architecture name -> (qkv bias by default, q/k norm)
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": (False, False),
    "MistralForCausalLM": (False, False),
    "Qwen2ForCausalLM": (True, False),
    "Qwen3ForCausalLM": (False, True),
    "Gemma3ForCausalLM": (False, True),
}
FULL, SLIDING = "full_attention", "sliding_attention"
# Gemma 3's config: every sixth layer sees the whole context (transformers' `_sliding_window_pattern`).
GEMMA3_SLIDING_PATTERN = 6


def gemma3_layer_types(num_layers: int, pattern: int = GEMMA3_SLIDING_PATTERN) -> list[str]:
    return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers)]


@dataclass(slots=True)
class ArchConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    torch_dtype: str
    sliding_window: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    # Per layer, FULL or SLIDING (a sliding layer sees the last `sliding_window` positions).
    layer_types: list[str] = field(default_factory=list)
    # Gemma 3: rope theta of the sliding layers, the query scale's denominator, the MLP's activation.
    rope_local_theta: float | None = None
    query_pre_attn_scalar: float | None = None
    hidden_act: str = "silu"

    @property
    def is_gemma3(self) -> bool:
        return self.architecture == "Gemma3ForCausalLM"

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def layer_window(self, layer: int) -> int | None:
        """The sliding window layer `layer` attends over, or None for the whole context."""
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> "ArchConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ValueError(f"model: no config.json in {model_dir}")
        return cls.from_dict(json.loads(path.read_text()))

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> "ArchConfig":
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"model: architecture {arch} is not supported "
                             f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
        default_bias, qk_norm = SUPPORTED_ARCHITECTURES[arch]
        heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        # transformers >= 5 moves rope settings into "rope_parameters".
        rope_params = dict(cfg.get("rope_parameters") or {})
        rope_scaling = cfg.get("rope_scaling") or None
        rope_theta = cfg.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        if rope_scaling is None and rope_params.get("rope_type", "default") != "default":
            rope_scaling = rope_params
        eos = cfg.get("eos_token_id")
        eos_ids = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
        gemma3 = arch == "Gemma3ForCausalLM"
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window", arch == "MistralForCausalLM" or gemma3) \
            else None
        layers = cfg["num_hidden_layers"]
        # Qwen2 slides only from layer max_window_layers on (transformers' Qwen2Config builds its layer_types so).
        first_sliding = cfg.get("max_window_layers", 0) if arch == "Qwen2ForCausalLM" else 0
        layer_types = list(cfg.get("layer_types") or (gemma3_layer_types(layers) if gemma3 else
                                                    [SLIDING if window and i >= first_sliding else FULL
                                                     for i in range(layers)]))
        if len(layer_types) != layers or set(layer_types) - {FULL, SLIDING}:
            raise ValueError(f"model: layer_types must name {FULL!r} or {SLIDING!r} for each of the {layers} layers")
        if not window:
            layer_types = [FULL] * layers
        local_theta = None
        if gemma3:
            # transformers >= 5 keys the rope settings by layer type; older configs name the local one.
            full = rope_params.get(FULL) or {}
            rope_theta = full.get("rope_theta", cfg.get("rope_theta", 1_000_000.0))
            local = rope_params.get(SLIDING) or {}
            local_theta = float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10000.0)))
            rope_scaling = None if full.get("rope_type", "default") == "default" else full
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", default_bias)),
            qk_norm=qk_norm,
            torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
            sliding_window=window,
            eos_token_ids=eos_ids,
            bos_token_id=cfg.get("bos_token_id"),
            layer_types=layer_types,
            rope_local_theta=local_theta,
            query_pre_attn_scalar=cfg.get("query_pre_attn_scalar") if gemma3 else None,
            hidden_act=cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu",
        )

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes
