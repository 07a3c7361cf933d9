"""Which layers slide, read from a config as transformers reads it."""
from __future__ import annotations

from kvserve.backend.models.arch_config import FULL, SLIDING, ArchConfig


def _config(arch: str, **extra) -> dict:
    return {"architectures": [arch], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, **extra}


def test_qwen2_slides_from_max_window_layers_on() -> None:
    cfg = ArchConfig.from_dict(_config("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=16,
                                       max_window_layers=2))
    assert cfg.layer_types == [FULL, FULL, SLIDING, SLIDING]
    assert [cfg.layer_window(i) for i in range(4)] == [None, None, 16, 16]


def test_a_window_that_is_switched_off_is_full_attention() -> None:
    off = ArchConfig.from_dict(_config("Qwen2ForCausalLM", use_sliding_window=False, sliding_window=16))
    assert off.layer_types == [FULL] * 4
    mistral = ArchConfig.from_dict(_config("MistralForCausalLM", sliding_window=16))  # Mistral's is on by default
    assert mistral.layer_types == [SLIDING] * 4
    assert ArchConfig.from_dict(_config("MistralForCausalLM", sliding_window=None)).layer_types == [FULL] * 4
