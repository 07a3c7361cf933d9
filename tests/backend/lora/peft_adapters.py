"""PEFT adapters for the tests, made with peft itself over a transformers model, with seeded
random weights (peft starts lora_B at zero, which would change nothing)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class AdapterSpec:
    rank: int
    alpha: float
    targets: tuple[str, ...]
    seed: int
    use_rslora: bool = False
    std: float = 1.0  # the delta's size relative to the layer's input (see make_adapter)


def make_adapter(hf_model, folder: Path, spec: AdapterSpec) -> Path:
    """Write a PEFT adapter folder for `hf_model` (left unchanged) and return it.

    lora_A ~ N(0, 1 / in) and lora_B ~ N(0, std^2 / r) / scaling, so each target adds a delta of
    about `std` times its input's size: enough to move greedy tokens, not to drown the model."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=list(spec.targets), lora_dropout=0.0,
                        use_rslora=spec.use_rslora, bias="none", init_lora_weights=True)
    peft_model = get_peft_model(hf_model, config)
    gen = torch.Generator().manual_seed(spec.seed)
    scaling = spec.alpha / (spec.rank ** 0.5 if spec.use_rslora else spec.rank)
    with torch.no_grad():
        for name, module in peft_model.named_modules():
            if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
                a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
                a.copy_(torch.randn(a.shape, generator=gen) / a.shape[1] ** 0.5)
                b.copy_(torch.randn(b.shape, generator=gen) * spec.std / (spec.rank ** 0.5 * scaling))
    peft_model.save_pretrained(str(folder))
    peft_model.unload()  # the base model's modules back as they were
    return folder
