"""The names an adapter is asked for by (vLLM's LoRARequest) and the one error its problems raise.

Standard library only: the Triton model and the offline API import these without the engine.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvserve.seam.error_wire import ErrorKind


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """An adapter over the base model: `lora_name` is what requests name it by (`model`),
    `lora_int_id` (> 0, one per adapter) joins the prefix-cache block hash, `lora_path` is a PEFT
    folder (adapter_config.json + adapter_model.safetensors)."""
    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise LoRAError("lora_name: an adapter needs a non-empty name")
        if not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool) or self.lora_int_id <= 0:
            raise LoRAError(f"lora_int_id: must be a positive integer, got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise LoRAError(f"lora_path: adapter {self.lora_name!r} needs a path")


class LoRAError(ValueError):
    """A bad or unknown adapter; the message names the problem (file, tensor, rank, target).

    `not_found`: the adapter name is unknown (HTTP 404 model_not_found); otherwise the adapter
    itself is at fault (HTTP 400)."""

    def __init__(self, message: str, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found
        self.param = "model"  # a request names its adapter by `model`

    @property
    def kind(self) -> ErrorKind:
        return ErrorKind.NOT_FOUND if self.not_found else ErrorKind.INVALID
