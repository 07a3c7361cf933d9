"""Whether a tensor-parallel size fits a model and an engine configuration, refused at start
with the numbers in the message (before any worker process is started).

How a model splits over `tp` ranks (Megatron-LM's scheme, as vLLM applies it):

    query heads     h / tp per rank                  tp must divide h
    KV heads        kv / tp per rank when tp <= kv   tp must divide kv
                    1 per rank, replicated, when tp > kv (tp must be a multiple of kv, so that each
                    rank's query heads all read the one KV head it holds)
    MLP             intermediate / tp per rank       tp must divide intermediate_size
    vocabulary      ceil(vocab / tp) rows per rank   the last shard padded with zero rows
"""
from __future__ import annotations

from dataclasses import dataclass

from kvserve.backend.models import ArchConfig


@dataclass(slots=True, frozen=True)
class TensorShard:
    """One rank's part of every split dimension."""
    rank: int
    size: int
    num_heads: int  # query heads on this rank
    num_kv_heads: int  # KV heads on this rank
    kv_head_start: int  # the first of the model's KV heads this rank holds
    intermediate: int  # MLP width on this rank
    vocab_rows: int  # embedding / logits rows per rank (the last rank's padded)

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_rows

    def cut(self, name: str, tensor, codes, arch: ArchConfig):
        """This rank's part of checkpoint tensor `name` and of its GGUF codes (weight_shard.py)."""
        from kvserve.backend.worker.parallel.weight_shard import shard_tensor
        return shard_tensor(name, tensor, codes, arch, self)


def check_parallel_plan(arch: ArchConfig, tp: int, quantization: str = "none", enable_lora: bool = False) -> None:
    """Raise ValueError naming `tensor_parallel_size` when `tp` cannot split this model."""
    if tp == 1:
        return
    name = "tensor_parallel_size"
    if arch.is_gemma3:
        raise ValueError(f"{name}: {tp} is not supported for Gemma 3 models yet (Llama-family decoders only)")
    heads, kv = arch.num_attention_heads, arch.num_key_value_heads
    if heads % tp:
        raise ValueError(f"{name}: {tp} does not divide the model's {heads} attention (query) heads; "
                         f"use a divisor of {heads}: {_divisors(heads)}")
    if tp <= kv and kv % tp:
        raise ValueError(f"{name}: {tp} does not divide the model's {kv} KV heads")
    if tp > kv and tp % kv:
        raise ValueError(f"{name}: {tp} is more than the model's {kv} KV heads and not a multiple of them")
    if arch.intermediate_size % tp:
        raise ValueError(f"{name}: {tp} does not divide the model's intermediate_size {arch.intermediate_size}")
    if quantization != "none":
        raise ValueError(f"{name}: {tp} with quantization {quantization!r} is not supported: each rank would "
                         f"quantize its shard with scales that differ from the whole weight's (a GGUF file's "
                         f"codes shard exactly; use one)")
    if enable_lora:
        raise ValueError(f"{name}: {tp} with enable_lora is not supported yet (the adapters are not sharded)")


def tensor_shard(arch: ArchConfig, rank: int, tp: int) -> TensorShard:
    kv = arch.num_key_value_heads
    local_kv = kv // tp if tp <= kv else 1
    kv_start = rank * local_kv if tp <= kv else rank // (tp // kv)
    return TensorShard(rank=rank, size=tp, num_heads=arch.num_attention_heads // tp, num_kv_heads=local_kv,
                       kv_head_start=kv_start, intermediate=arch.intermediate_size // tp,
                       vocab_rows=-(-arch.vocab_size // tp))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
