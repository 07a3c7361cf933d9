"""One tensor-parallel rank's slice of a checkpoint tensor (and of its GGUF codes), taken as the
tensor is read, so that no rank keeps more than its shard (one whole tensor at a time passes
through on its way: a GGUF tensor is dequantized whole).

Megatron-LM's split, with `shard` a plan.TensorShard (the loader calls `shard.cut`, so that
models/ needs nothing from here):

    column-parallel (output rows split)   q_proj, k_proj, v_proj (by heads), gate_proj, up_proj,
                                          embed_tokens and lm_head (by vocabulary rows)
    row-parallel (input columns split)    o_proj, down_proj: each rank's product is a partial sum,
                                          the model all-reduces it
    replicated                            the norms (and q/k norms, per head_dim)

The codes of a column-parallel weight are rows like its values; those of a row-parallel weight
are cut between blocks (16 inputs per step and offset), and dropped where a cut would fall inside
one (the shard then runs on the float32 path: slower, same values).
"""
from __future__ import annotations

import torch

from kvserve.backend.models import CODES_PER_STEP as HALF
from kvserve.backend.models import ArchConfig, BlockCodes


def _row_range(rest: str, arch: ArchConfig, shard) -> tuple[int, int] | None:
    hd = arch.head_dim
    if rest.startswith("self_attn.q_proj."):
        return shard.rank * shard.num_heads * hd, (shard.rank + 1) * shard.num_heads * hd
    if rest.startswith(("self_attn.k_proj.", "self_attn.v_proj.")):
        return shard.kv_head_start * hd, (shard.kv_head_start + shard.num_kv_heads) * hd
    if rest.startswith(("mlp.gate_proj.", "mlp.up_proj.")):
        return shard.rank * shard.intermediate, (shard.rank + 1) * shard.intermediate
    return None


def _column_range(rest: str, arch: ArchConfig, shard) -> tuple[int, int] | None:
    if rest == "self_attn.o_proj.weight":
        width = shard.num_heads * arch.head_dim
        return shard.rank * width, (shard.rank + 1) * width
    if rest == "mlp.down_proj.weight":
        return shard.rank * shard.intermediate, (shard.rank + 1) * shard.intermediate
    return None


def _rows(tensor: torch.Tensor, codes: BlockCodes | None, start: int, end: int):
    part = tensor[start:end].clone()
    return part, None if codes is None else codes.rows(lambda a: a[start:end].copy())


def _columns(tensor: torch.Tensor, codes: BlockCodes | None, start: int, end: int):
    part = tensor[:, start:end].contiguous()
    if codes is None or start % HALF or end % HALF:
        return part, None
    return part, BlockCodes(codes.kind, codes.codes[:, start:end].copy(), codes.step[:, start // HALF:end // HALF].copy(),
                            codes.offset[:, start // HALF:end // HALF].copy())


def _vocab_rows(tensor: torch.Tensor, codes: BlockCodes | None, shard):
    start = shard.vocab_start
    part, codes = _rows(tensor, codes, start, min(start + shard.vocab_rows, tensor.shape[0]))
    if part.shape[0] < shard.vocab_rows:  # the last shard: zero rows past the vocabulary never win
        pad = part.new_zeros(shard.vocab_rows - part.shape[0], *part.shape[1:])
        part, codes = torch.cat([part, pad]), None
    return part, codes


def shard_tensor(name: str, tensor: torch.Tensor, codes: BlockCodes | None, arch: ArchConfig, shard):
    """(this rank's part of `tensor`, its codes or None); `name` is the checkpoint's (HF) name."""
    bare = name.removeprefix("model.")
    if bare in ("embed_tokens.weight", "lm_head.weight"):
        return _vocab_rows(tensor, codes, shard)
    if not bare.startswith("layers."):
        return tensor, codes
    rest = bare.split(".", 2)[2]
    rows = _row_range(rest, arch, shard)
    if rows is not None:
        return _rows(tensor, codes, *rows)
    cols = _column_range(rest, arch, shard)
    if cols is not None:
        return _columns(tensor, codes, *cols)
    return tensor, codes
