"""The process groups of one parallel world: collectives through torch.distributed.

One group per axis (gloo, or NCCL for the tensors on CUDA) over one TCPStore rendezvous on
`master_addr:master_port`. Rank r is stage r // tp, tensor-parallel rank r % tp:

    control   rank 0 -> workers: each step's SchedulerOutput, as JSON (wire.py) in a uint8 tensor and
              broadcast. No bound on a worker's side: an idle engine sends nothing for hours, and
              a worker must wait for it (it still learns at once when rank 0's process dies: the
              socket closes). Bounded on rank 0's side: a send completes only once the worker
              has posted its receive, so a worker stopped while it waited for a step would
              otherwise hang rank 0 in its next send, where no bounded collective is reached.
    start-up  the ranks' KV block counts (min_over_ranks), unbounded on every rank: the ranks
              load their shards at their own pace.
    tensor    the forward's all-reduces and the logits' all-gather, bounded by `timeout_s`: a
              worker that died or stopped makes rank 0's next collective fail within the bound,
              and rank 0 fails the engine (WorkerLost) instead of hanging a request forever.
              One per pipeline stage, over that stage's tp ranks (none when tp == 1).
    pipeline  the activations stage to stage, point to point (pipeline.py): one group per
              tensor-parallel index, over the pp ranks that share it (none when pp == 1), bounded
              like the tensor group.
    logits    the last stage's logits back to rank 0: gloo, those two ranks only.

The groups are made directly (ProcessGroupGloo(store, ...)), not through init_process_group,
so that no process-wide default group exists: several engines may live in one process (tests),
each with its own world.
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from kvserve.backend.worker.parallel.wire import decode_message, encode_message

_FOREVER = datetime.timedelta(days=365)


class WorkerLost(RuntimeError):
    """A rank died, hung past the bound, or broke its connection: the engine cannot step again."""


def _make_group(store, prefix: str, rank: int, size: int, timeout: datetime.timedelta, device: torch.device):
    prefixed = dist.PrefixStore(prefix, store)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, size, options)
    return dist.ProcessGroupGloo(prefixed, rank, size, timeout)


class RankGroup:
    """This process's place in the world and its collectives. `size == 1` is never built: the
    single-process path has no group at all."""

    def __init__(self, store, rank: int, size: int, timeout_s: float, device: torch.device,
                 pipeline_size: int = 1) -> None:
        self.store, self.rank, self.size, self.device = store, rank, size, device
        self.timeout = datetime.timedelta(seconds=timeout_s)
        # The world is pipeline_size stages of tp_size ranks; `size` is all of them.
        self.pp_size, self.tp_size = pipeline_size, size // pipeline_size
        self.stage, self.tp_rank = divmod(rank, self.tp_size)
        # Every rank makes its groups in this order (each constructor waits for its members): no cycle.
        self.tensor = None
        if self.tp_size > 1:  # the first stage's keeps the TP-only prefix: same store keys as before PP
            prefix = "tensor" if self.stage == 0 else f"tensor/{self.stage}"
            self.tensor = _make_group(store, prefix, self.tp_rank, self.tp_size, self.timeout, device)
        # Objects travel on the CPU whatever the device: gloo for the control group always. Each
        # rank's own timeout: rank 0's sends are bounded, a worker's wait for the next step is not.
        self.control = dist.ProcessGroupGloo(dist.PrefixStore("control", store), rank, size,
                                             self.timeout if rank == 0 else _FOREVER)
        self.startup = dist.ProcessGroupGloo(dist.PrefixStore("startup", store), rank, size, _FOREVER)
        self.pipeline = None
        if self.pp_size > 1:  # group rank = stage
            self.pipeline = _make_group(store, f"pipeline/{self.tp_rank}", self.stage, self.pp_size, self.timeout,
                                        device)
        # The last stage's logits to rank 0 (group ranks 0 and 1), apart from the activations so that
        # a return never waits behind the next micro-batch's send; gloo (CPU) on every device.
        self.logits = None
        if self.pp_size > 1 and self.tp_rank == 0 and self.stage in (0, self.pp_size - 1):
            self.logits = dist.ProcessGroupGloo(dist.PrefixStore("logits", store), int(self.stage > 0), 2,
                                                self.timeout)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (the row-parallel projections' partial sums)."""
        try:
            self.tensor.allreduce([x]).wait()
        except RuntimeError as exc:
            raise WorkerLost(f"tensor parallel all-reduce failed: {exc}") from exc
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` side by side along the last dimension (the vocabulary shards)."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.tp_size)]
        try:
            self.tensor.allgather([parts], [x]).wait()
        except RuntimeError as exc:
            raise WorkerLost(f"tensor parallel all-gather failed: {exc}") from exc
        return torch.cat(parts, dim=-1)

    def min_over_ranks(self, value: int) -> int:
        """The smallest of every rank's `value`, at start-up (the KV block count all ranks can hold).
        On the unbounded start-up group: the ranks load their shards at their own pace."""
        mine = torch.tensor([value], dtype=torch.int64)
        parts = [torch.empty_like(mine) for _ in range(self.size)]
        try:
            self.startup.allgather([parts], [mine]).wait()
        except RuntimeError as exc:
            raise WorkerLost(f"tensor parallel start-up failed: {exc}") from exc
        return int(torch.cat(parts).min())

    def send_object(self, obj) -> None:
        """Rank 0: hand `obj` to every worker (size first, then the bytes)."""
        data = torch.frombuffer(bytearray(encode_message(obj)), dtype=torch.uint8)
        try:
            self.control.broadcast(torch.tensor([data.numel()], dtype=torch.int64), 0).wait()
            self.control.broadcast(data, 0).wait()
        except RuntimeError as exc:
            raise WorkerLost(f"sending the step to the workers failed: {exc}") from exc

    def receive_object(self):
        """A worker: the next object rank 0 sends (blocks while the engine is idle)."""
        length = torch.zeros(1, dtype=torch.int64)
        self.control.broadcast(length, 0).wait()
        data = torch.empty(int(length), dtype=torch.uint8)
        self.control.broadcast(data, 0).wait()
        return decode_message(data.numpy().tobytes())


def open_store(master_addr: str, master_port: int, world_size: int, is_master: bool,
               timeout_s: float) -> dist.TCPStore:
    """The rendezvous: rank 0 listens (port 0 picks a free one; `.port` tells it), the others connect."""
    return dist.TCPStore(master_addr, master_port, world_size, is_master,
                         datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
