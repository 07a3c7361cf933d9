"""Memory per rank of a tensor x pipeline parallel layout, from the shapes each rank allocates: the
model of every rank is built on the meta device exactly as its worker builds it (its shard, its
stage), its parameters counted, and its KV bytes per token computed as the runner sizes them.

    python loadtests/studies/parallel/pp_memory.py [--model PATH] --layouts 1x1 1x2 3x1 3x2

(TPxPP; the default model is SmolLM2-135M-Instruct, kvserve's default.) Parameters are counted as
loaded (float32), before the CPU path packs or keeps GGUF codes.
"""
from __future__ import annotations

import argparse

import torch

from kvserve.backend.models import LlamaForCausalLM, load_arch_config
from kvserve.backend.worker.parallel.plan import check_parallel_plan, tensor_shard
from kvserve.backend.worker.parallel.stage_plan import check_pipeline_plan, stage_plan


def rank_params(arch, tp: int, pp: int, rank: int) -> tuple[int, int]:
    """(parameters, KV bytes per token in float32) of `rank`."""
    stage_index, tp_rank = divmod(rank, tp)
    shard = tensor_shard(arch, tp_rank, tp) if tp > 1 else None
    stage = stage_plan(arch, stage_index, pp) if pp > 1 else None
    with torch.device("meta"):
        model = LlamaForCausalLM(arch, 16, shard, None, stage)
    params = sum(p.numel() for p in model.parameters())
    kv_heads = arch.num_key_value_heads if shard is None else shard.num_kv_heads
    return params, 2 * len(model.layers) * kv_heads * arch.head_dim * 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--layouts", nargs="+", default=["1x1", "1x2", "3x1", "3x2"])
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    if args.model is None:
        from kvserve.backend.models import DEFAULT_CHAT_MODEL, ensure_known_model
        args.model = str(ensure_known_model(DEFAULT_CHAT_MODEL))
    arch = load_arch_config(args.model)
    print("| TPxPP | rank | weights (params, float32) | KV per token | one block |")
    print("|---|---|---|---|---|")
    for layout in args.layouts:
        tp, pp = (int(x) for x in layout.split("x"))
        check_parallel_plan(arch, tp)
        check_pipeline_plan(arch, pp)
        for rank in range(tp * pp):
            params, kv = rank_params(arch, tp, pp, rank)
            print(f"| {tp}x{pp} | {rank} (stage {rank // tp}) | {params / 1e6:.1f} M, {params * 4 / 1e6:.0f} MB "
                  f"| {kv:,} B | {kv * args.block_size:,} B |")


if __name__ == "__main__":
    main()
