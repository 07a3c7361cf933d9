"""One step of a pipeline-parallel world on this rank: the step's batch as micro-batches through the
stages, activations stage to stage, and the last stage's logits back to rank 0.

Every rank receives the whole SchedulerOutput (the control group's broadcast, as with tensor
parallelism) and cuts it the same way: `split` gives up to `micro_batches` contiguous runs of
requests with about the same number of tokens each. Then, per micro-batch, in order:

    first stage    embed, run its layers, send (hidden, residual) to the next stage (async)
    middle stage   receive (hidden, residual), run its layers, send them on (async)
    last stage     receive, run its layers, final norm and logits; its tensor-parallel rank 0 sends
                   the logits (the sampling rows only, whole vocabulary) to rank 0 (async)

Sends are asynchronous, so stage 0 computes micro-batch 2 while stage 1 computes micro-batch 1.
Rank 0 (first stage, tensor-parallel rank 0) sends all its micro-batches, then receives the logits
of each from the last stage on a group of their own (RankGroup.logits: gloo, the two of them), so
a return never queues behind the activations of the next micro-batch; it concatenates them in
request order, which is the order of the whole batch, and samples. Receivers know every shape from
the SchedulerOutput they all hold: only the tensors travel.

What overlaps: the stages within one step, micro-batch by micro-batch. What does not: two steps
(rank 0 samples step n before it schedules step n + 1, so the first stage idles while the last
finishes a step, and the last idles while the first starts the next; vLLM overlaps whole steps with
one virtual engine per stage instead). Every wait has the step's bound: a stage that died or stopped
fails rank 0 with WorkerLost within it.
"""
from __future__ import annotations

import torch

from kvserve.backend.engine import SchedulerOutput
from kvserve.backend.worker.parallel.distributed import WorkerLost

_ACTIVATIONS, _LOGITS = 0, 1  # gloo tags


def split(out: SchedulerOutput, micro_batches: int) -> list[SchedulerOutput]:
    """Up to `micro_batches` contiguous, non-empty runs of the scheduled requests, cut where the
    running token count crosses each equal share (deterministic: every rank cuts alike)."""
    sched = out.scheduled
    count = max(1, min(micro_batches, len(sched)))
    total = sum(len(s.token_ids) for s in sched)
    parts: list[list] = [[] for _ in range(count)]
    seen, part = 0, 0
    for i, s in enumerate(sched):
        left = len(sched) - i  # requests left, this one included: every later part must get one
        if parts[part] and (seen >= total * (part + 1) / count or left <= count - 1 - part) and part < count - 1:
            part += 1
        parts[part].append(s)
        seen += len(s.token_ids)
    return [SchedulerOutput(scheduled=p) for p in parts if p]


class PipelineStep:
    """This rank's part of each step: `execute` returns (logits, sample ids) on rank 0, None elsewhere."""

    def __init__(self, runner, group, micro_batches: int) -> None:
        self.runner, self.group, self.micro_batches = runner, group, micro_batches
        self.stage, self.size = group.stage, group.pp_size
        self.first, self.last = self.stage == 0, self.stage == self.size - 1
        self.is_driver = group.rank == 0
        self.returns_logits = self.last and group.tp_rank == 0
        self.timeout = group.timeout
        self.hidden = runner.arch.hidden_size
        self.vocab = runner.arch.vocab_size

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput):
        runner = self.runner
        pending: list = []  # (work, tensor): a send's tensor lives until the send is done
        returns: list[tuple[int, list[str]]] = []  # rank 0: per micro-batch, its sampling rows
        for mb in split(out, self.micro_batches):
            input_ids, positions, meta, logits_indices, sample_ids = runner._prepare(mb)
            if self.first:
                inputs, residual = input_ids, None
            else:
                received = torch.empty(2, input_ids.shape[0], self.hidden, dtype=runner.dtype, device=runner.device)
                self._wait(self.group.pipeline.recv([received], self.stage - 1, _ACTIVATIONS), "receiving activations")
                inputs, residual = received[0], received[1]
            result = runner.model.forward_stage(runner.ops, inputs, residual, positions, runner.kv_caches, meta,
                                                logits_indices)
            if not self.last:
                packed = torch.stack(result)
                pending.append((self.group.pipeline.send([packed], self.stage + 1, _ACTIVATIONS), packed))
            elif self.returns_logits and logits_indices.shape[0]:
                logits = result.contiguous().cpu()
                pending.append((self.group.logits.send([logits], 0, _LOGITS), logits))
            if self.is_driver:
                returns.append((logits_indices.shape[0], sample_ids))
        for work, _ in pending:
            self._wait(work, "sending activations")
        if not self.is_driver:
            return None
        parts, ids = [], []
        for rows, sample_ids in returns:
            if rows:
                logits = torch.empty(rows, self.vocab, dtype=torch.float32)
                self._wait(self.group.logits.recv([logits], 1, _LOGITS), "receiving the last stage's logits")
                parts.append(logits)
                ids += sample_ids
        logits = torch.cat(parts) if parts else torch.empty(0, self.vocab, dtype=torch.float32)
        return logits.to(runner.device), ids

    def _wait(self, work, what: str) -> None:
        try:
            work.wait(self.timeout)
        except RuntimeError as exc:
            raise WorkerLost(f"pipeline parallel: {what} failed (stage {self.stage}): {exc}") from exc

