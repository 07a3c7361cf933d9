"""LoRA adapters over one base model: PEFT (and refused GGUF) adapter files, the engine's registry
of adapters with its CPU cache, the device slots, and the wrapped projections whose batched
shrink/expand products add each row's adapter."""
from __future__ import annotations

from kvserve.backend import exports_loader

_EXPORTS = {
    "LoRAAdapter": ".adapter",
    "LoRAError": ".lora_request",
    "LoRARegistry": ".registry",
    "LoRARequest": ".lora_request",
    "LoRASlots": ".slots",
    "TargetShapes": ".adapter",
    "load_adapter": ".adapter",
    "wrap_model": ".layers",
}
__all__ = sorted(_EXPORTS)
__getattr__ = exports_loader(__name__, _EXPORTS)
