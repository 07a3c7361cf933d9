"""Tensor and pipeline parallelism over torch.distributed: the plans that check the sizes against a
model (plan.py, stage_plan.py), the process groups, the rank-0 executor that drives the worker
processes, the worker loop, and a pipeline step's micro-batches through the stages (pipeline.py).

Rank 0 is the engine's own process: it keeps the one scheduler and KV manager and runs its shard
of the forward like every other rank. Workers (ranks 1..N-1) receive each step's SchedulerOutput
(new block ids only, as the runner always did) and run the same ModelRunner over their shard.
"""
from kvserve.backend.worker.parallel.distributed import RankGroup, WorkerLost
from kvserve.backend.worker.parallel.plan import check_parallel_plan

__all__ = ["RankGroup", "WorkerLost", "check_parallel_plan"]
