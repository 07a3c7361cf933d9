"""Whether a pipeline-parallel size fits a model and an engine configuration (refused at start
with the numbers in the message, before any worker process starts), and which layers each stage
holds.

How a model splits over `pp` stages of `tp` ranks each (rank = stage * tp + tp_rank, vLLM's order,
so rank 0 is the first stage's first tensor-parallel rank: the engine's process):

    layers          L / pp contiguous layers per stage      pp must divide num_hidden_layers
    embedding       the first stage only (the last too when the logits reuse it: tied embeddings)
    final norm,     the last stage only
    logits
    KV cache        each stage its layers' KV tensors only (the block ids are the same everywhere:
                    one KV manager on rank 0 hands them out)
"""
from __future__ import annotations

from dataclasses import dataclass

from kvserve.backend.models import ArchConfig


@dataclass(slots=True, frozen=True)
class StagePlan:
    """One pipeline stage: layers [start, end) of the model, and whether it begins or ends it.
    models/llama.py reads these four fields (duck-typed: models/ imports nothing from here)."""
    index: int
    size: int
    start: int
    end: int

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.size - 1

    @property
    def num_layers(self) -> int:
        return self.end - self.start


def check_pipeline_plan(arch: ArchConfig, pp: int, quantization: str = "none", enable_lora: bool = False) -> None:
    """Raise ValueError naming `pipeline_parallel_size` when `pp` cannot split this model."""
    if pp == 1:
        return
    name = "pipeline_parallel_size"
    layers = arch.num_hidden_layers
    if arch.is_gemma3:
        raise ValueError(f"{name}: {pp} is not supported for Gemma 3 models yet (Llama-family decoders only)")
    if layers % pp:
        raise ValueError(f"{name}: {pp} does not divide the model's {layers} layers (num_hidden_layers); "
                         f"use a divisor of {layers}: {[d for d in range(1, layers + 1) if layers % d == 0]}")
    if quantization != "none":
        raise ValueError(f"{name}: {pp} with quantization {quantization!r} is not supported yet (the shard "
                         f"code does not quantize a stage; a GGUF file's codes load per stage: use one)")
    if enable_lora:
        raise ValueError(f"{name}: {pp} with enable_lora is not supported yet (the adapters are not split by stage)")


def stage_plan(arch: ArchConfig, index: int, pp: int) -> StagePlan:
    per_stage = arch.num_hidden_layers // pp
    return StagePlan(index=index, size=pp, start=index * per_stage, end=(index + 1) * per_stage)
