"""This rank's place in a parallel world of tensor_parallel_size x pipeline_parallel_size ranks, as
the model runner needs it: the plans checked (before any worker starts), the workers started on
rank 0, and this rank's tensor shard, pipeline stage and micro-batch count."""
from __future__ import annotations

import os
from dataclasses import dataclass

from kvserve.backend.models import ArchConfig
from kvserve.backend.worker.parallel.plan import TensorShard, check_parallel_plan, tensor_shard
from kvserve.backend.worker.parallel.stage_plan import StagePlan, check_pipeline_plan, stage_plan

_MICRO_BATCHES_KEY = "pp_micro_batches"


@dataclass(slots=True)
class RankLayout:
    executor: object | None  # rank 0 only: the workers' handle (executor.TensorParallelExecutor)
    group: object  # distributed.RankGroup
    shard: TensorShard | None  # None: tensor_parallel_size 1
    stage: StagePlan | None  # None: pipeline_parallel_size 1
    micro_batches: int  # per step, pipeline parallelism only

    @property
    def model_group(self):
        """The group the model's own collectives use: only tensor parallelism has any."""
        return self.group if self.shard is not None else None


def join_world(config, arch: ArchConfig, threads: int, device, group=None) -> RankLayout:
    """Rank 0 (`group` None) starts the workers; a worker passes the group it joined."""
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    check_parallel_plan(arch, tp, config.quantization, config.enable_lora)
    check_pipeline_plan(arch, pp, config.quantization, config.enable_lora)
    # Rank 0 decides the micro-batches per step (KVSERVE_PP_MICRO_BATCHES, default one per stage)
    # and tells the workers through the store: every rank must cut each step alike.
    micro_batches = micro_batch_count(pp, os.environ.get("KVSERVE_PP_MICRO_BATCHES")) if pp > 1 else 1
    executor = None
    if group is None:
        from kvserve.backend.worker.parallel.executor import TensorParallelExecutor
        executor = TensorParallelExecutor(config, tp * pp, threads, device)
        group = executor.group
        if pp > 1:
            group.store.set(_MICRO_BATCHES_KEY, str(micro_batches))
    elif pp > 1:
        micro_batches = int(group.store.get(_MICRO_BATCHES_KEY).decode())
    return RankLayout(executor=executor, group=group,
                      shard=tensor_shard(arch, group.tp_rank, tp) if tp > 1 else None,
                      stage=stage_plan(arch, group.stage, pp) if pp > 1 else None, micro_batches=micro_batches)


def micro_batch_count(default: int, value: str | None) -> int:
    if value is None or value == "":
        return default
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"KVSERVE_PP_MICRO_BATCHES: must be a positive integer, got {value!r}")
    return count
