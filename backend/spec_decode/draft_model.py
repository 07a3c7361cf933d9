"""vLLM's `draft_model` method: a small model with the target's tokenizer guesses each request's
next k tokens, one draft forward per guessed token, and the target verifies them in one forward.

The draft's KV cache is its own tensors (its layers, heads and dtype) but not its own blocks: it is
indexed by the block ids the KV manager gave the target's first full-attention group. A token's
draft KV sits in the same block id as its target KV, only in the draft's tensors:

    KV manager:      request r -> blocks [7, 3, 12]        (one table, allocated once)
    target tensors:  K[layer][7], K[layer][3], K[layer][12]   (target layers)
    draft tensors:   Kd[layer][7], Kd[layer][3], Kd[layer][12]  (draft layers)

So the draft needs no block of its own: it is allocated, preempted, aborted, freed and counted
with the target's, and can never leak or outlive it. Its cost is memory per block, not blocks.

The draft runs lazily: only for requests granted proposals this step (after the scheduler has
allocated their 1 + k slots). It first catches up on the positions it has not seen (the whole
context after a (re)start, then usually the one token the target emitted after the last run), then
proposes one token per forward. A prefix-cache hit never counts as draft KV (the request that
wrote the block may never have run its draft there): a restarted request catches up from 0.

Greedy requests get the draft's argmax. Sampled requests get a draw from the draft's distribution q
after the request's own temperature, top-k, top-p and min-p; q is kept for the rejection sampler
(accept with min(1, p/q), else draw from the normalised max(0, p - q)).
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Callable

import torch

log = logging.getLogger("kvserve.engine")

PLACEHOLDER = 0  # a proposal slot before the draft has run: verified like any token if it never does

# (request id, one row [1, vocab] of draft logits) -> (the logits plain sampling would draw from,
# or None for a greedy request; the request's generator or None)
Shape = Callable[[str, torch.Tensor], tuple[torch.Tensor | None, torch.Generator | None]]


@dataclass(slots=True)
class _Chunk:
    """One request's tokens in a draft forward: the fields of the scheduler's ScheduledRequest the
    runner reads (duck-typed: this package imports nothing of the engine)."""
    request_id: str
    token_ids: list[int]
    start_position: int
    new_block_ids: list[list[int]]
    samples: bool
    num_spec_tokens: int = 0
    lora_int_id: int = 0
    prompt_logits: int = 0  # the draft never scores prompts


@dataclass(slots=True)
class _Pass:
    """A SchedulerOutput for the draft's runner."""
    scheduled: list[_Chunk]
    preempted_request_ids: list[str] = field(default_factory=list)
    finished_request_ids: list[str] = field(default_factory=list)
    new_request_ids: list[str] = field(default_factory=list)
    scores_prompts: bool = False


def check_draft(target_tokenizer, target_vocab: int, draft_tokenizer, draft_arch, max_model_len: int) -> None:
    """Refuse, naming `speculative_config.model`, a draft whose proposals the target could not
    verify as tokens of its own vocabulary, or whose KV could not share the target's blocks."""
    if draft_arch.vocab_size != target_vocab:
        raise ValueError(f"speculative_config.model: the draft's vocabulary has {draft_arch.vocab_size} tokens, "
                         f"the target's {target_vocab}: a draft must share the target's tokenizer")
    mine = target_tokenizer.tokenizer.get_vocab(with_added_tokens=True)
    theirs = draft_tokenizer.tokenizer.get_vocab(with_added_tokens=True)
    if mine != theirs:
        differ = sorted(set(mine.items()) ^ set(theirs.items()), key=lambda kv: kv[1])
        token, tid = differ[0]
        raise ValueError(f"speculative_config.model: the draft's tokenizer differs from the target's "
                         f"({len(differ)} entries differ, e.g. token {token!r} / id {tid})")
    if draft_arch.max_position_embeddings < max_model_len:
        raise ValueError(f"speculative_config.model: the draft's context ({draft_arch.max_position_embeddings} "
                         f"positions) is shorter than max_model_len ({max_model_len})")
    if any(draft_arch.layer_window(i) is not None for i in range(draft_arch.num_hidden_layers)):
        raise ValueError("speculative_config.model: a draft with sliding-window layers is not supported "
                         "(its KV shares one block table with the target)")


def load_draft(spec, target_config, target_runner, target_tokenizer, load_tokenizer) -> "DraftModel":
    """The draft's runner, after the checks: same block size and block count as the target's, so
    the target's block ids index its cache. `load_tokenizer(path)` is the engine's loader."""
    from kvserve.backend.models import load_arch_config
    from kvserve.backend.worker import ModelRunner

    if target_runner.kv_groups[0].window is not None:
        raise ValueError("speculative_config.method: draft_model needs a target with full-attention layers "
                         "(the draft's KV follows their block table)")
    check_draft(target_tokenizer, target_runner.arch.vocab_size, load_tokenizer(spec.model),
                load_arch_config(spec.model), target_runner.max_model_len)
    config = dataclasses.replace(
        target_config, model=spec.model, tokenizer=None, served_model_name=None, speculative_config=None,
        num_kv_blocks=target_runner.num_blocks, kv_cache_memory=None, max_model_len=target_runner.max_model_len,
        enable_lora=False, tensor_parallel_size=1, enforce_eager=True,
        debug=dataclasses.replace(target_config.debug, fault_injection_step=None))
    runner = ModelRunner(config)
    log.info("draft model %s: %d layers, KV %.1f MiB beside the target's", spec.model,
             runner.arch.num_hidden_layers, runner.num_blocks * runner.block_bytes / 2**20)
    return DraftModel(runner)


class DraftModel:
    """The proposer of `draft_model`: placeholders before the schedule (so the scheduler counts and
    allocates the slots), the draft's tokens after it (`fill`)."""

    def __init__(self, runner) -> None:
        self.runner = runner
        # request id -> the positions [0, n) whose draft KV holds that request's tokens
        self._written: dict[str, int] = {}
        # request id -> q [k, vocab] of this step's proposals (sampled requests only)
        self.probs: dict[str, torch.Tensor] = {}
        self.num_forwards = 0  # draft forward passes run (tests, benchmarks)

    def sync(self, running) -> None:
        """Nothing to do before the schedule: the draft runs after it."""

    def propose(self, req, k: int) -> list[int]:
        return [PLACEHOLDER] * k

    def reset(self) -> None:
        """After a failed step: every request was failed."""
        self.runner.reset_block_tables()
        self._written.clear()
        self.probs = {}

    def num_tracked(self) -> int:
        """Requests whose draft KV state is kept (0 once all have finished: nothing leaks)."""
        return len(self._written) + len(self.runner.block_tables)

    def fill(self, sched, requests, shape: Shape) -> int:
        """Replace this step's placeholders with the draft's proposals; returns the draft tokens run.
        The draft's block tables follow the target's first group every step, proposals or not."""
        self.probs = {}
        self.runner.update_block_tables(_Pass(
            [_Chunk(s.request_id, [], s.start_position, [s.new_block_ids[0]], False) for s in sched.scheduled],
            list(sched.preempted_request_ids), list(sched.finished_request_ids)))
        for rid in (*sched.finished_request_ids, *sched.preempted_request_ids):
            self._written.pop(rid, None)
        todo = [s for s in sched.scheduled if s.num_spec_tokens]
        if not todo:
            return 0
        try:
            return self._run(todo, requests, shape)
        except Exception:
            # Unknown draft KV from here on: each of these requests catches up from 0 next time.
            for s in todo:
                self._written.pop(s.request_id, None)
            self.probs = {}
            raise

    def _run(self, todo, requests, shape: Shape) -> int:
        drafts: dict[str, list[int]] = {s.request_id: [] for s in todo}
        qs: dict[str, list[torch.Tensor]] = {s.request_id: [] for s in todo}
        chunks = []
        for s in todo:
            start = min(self._written.get(s.request_id, 0), s.start_position)
            chunks.append(_Chunk(s.request_id, requests[s.request_id].token_ids_slice(start, s.start_position + 1),
                                 start, [[]], True))
        num_tokens = 0
        active = list(todo)
        while active:
            num_tokens += sum(len(c.token_ids) for c in chunks)
            logits, ids = self.runner.execute(_Pass(chunks))
            self.num_forwards += 1
            for i, rid in enumerate(ids):
                processed, generator = shape(rid, logits[i:i + 1])
                if processed is None:
                    drafts[rid].append(int(logits[i].argmax()))
                    continue
                q = processed[0].float().softmax(dim=-1)
                drafts[rid].append(int(torch.multinomial(q, 1, generator=generator)))
                qs[rid].append(q)
            active = [s for s in active if len(drafts[s.request_id]) < s.num_spec_tokens]
            chunks = [_Chunk(s.request_id, [drafts[s.request_id][-1]],
                             s.start_position + len(drafts[s.request_id]), [[]], True) for s in active]
        for s in todo:
            rid, k = s.request_id, s.num_spec_tokens
            s.token_ids[-k:] = drafts[rid]
            requests[rid].spec_token_ids[:] = drafts[rid]
            # Written: the catch-up, the last known token and the first k - 1 proposals.
            self._written[rid] = s.start_position + k
            if qs[rid]:
                self.probs[rid] = torch.stack(qs[rid])
        return num_tokens
