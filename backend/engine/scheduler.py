"""Iteration-level scheduler: one token budget per step over RUNNING, then WAITING.

Prompt and generated tokens are treated alike: each step gives every chosen
request a number of tokens to compute (a prefill chunk or one decode token),
so chunked prefill and decodes share one forward pass. When KV blocks run out,
the newest running request is preempted (its blocks freed, recomputed later).

With the priority policy (vLLM's --scheduling-policy priority) the waiting
queue is ordered by (priority, arrival), lower first, and the preempted request
is the least urgent running one by the same order, as vLLM's scheduler picks it.
Never touches tensors.
"""
from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, field

from kvserve.backend.engine.request import Request, RequestStatus
from kvserve.backend.kv_cache import KVCacheManager


@dataclass(slots=True)
class ScheduledRequest:
    """What the model runner needs to compute one request's tokens this step."""
    request_id: str
    token_ids: list[int]       # the tokens to compute, positions start .. start+len-1
    start_position: int        # = num_computed_tokens before this step
    new_block_ids: list[list[int]]  # per KV cache group: blocks got since the last step (all when it (re)starts)
    samples: bool              # True when this chunk reaches the end of the known tokens
    # The last num_spec_tokens of token_ids are proposals to verify: the runner returns logits
    # for each of the last 1 + num_spec_tokens rows.
    num_spec_tokens: int = 0
    lora_int_id: int = 0  # the LoRA adapter its rows run with (0: the base model)
    # Prompt logprobs: the runner also returns the logits of the first prompt_logits rows, row i
    # scoring prompt token start_position + i + 1 (before the request's sampling rows, if any).
    prompt_logits: int = 0


@dataclass(slots=True)
class SchedulerOutput:
    """The only contract between scheduler and runner. The runner keeps each
    request's block table across steps: it forgets the tables of finished and
    preempted requests, then appends each scheduled request's new blocks."""
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    new_request_ids: list[str] = field(default_factory=list)  # first scheduled this step (log_scheduling)
    preempted_request_ids: list[str] = field(default_factory=list)
    finished_request_ids: list[str] = field(default_factory=list)  # since the last step

    @property
    def num_scheduled_tokens(self) -> dict[str, int]:
        return {s.request_id: len(s.token_ids) for s in self.scheduled}

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def scores_prompts(self) -> bool:
        return any(s.prompt_logits for s in self.scheduled)


# The float32 logits of the prompt rows one step may score, beyond the rows the step's profile holds
# (SmolLM2's 49,152-token vocabulary: 1,365 rows; Gemma 3's 262,144: 256).
SCORED_LOGITS_BYTES = 256 * 2**20


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_loras: int | None = None, vocab_size: int = 0, priority: bool = False) -> None:
        self.kv = kv
        self.priority = priority  # the priority policy; False: first come, first served
        self.max_loras = max_loras  # None: no LoRA bound (adapters off)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # Prompt tokens a step may score (prompt logprobs): each needs a row of logits over the whole
        # vocabulary. The memory planned for a step (the runner's profile) holds one row per sequence
        # and the sampler's copies of it; beyond that, rows up to SCORED_LOGITS_BYTES in all. A long
        # prompt is scored over several steps.
        by_bytes = SCORED_LOGITS_BYTES // (4 * vocab_size) if vocab_size else 0
        self.max_scored_tokens = max(2 * max_num_seqs, 32, by_bytes)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_since_last_step: list[str] = []
        self.num_preemptions_total = 0

    def add_request(self, req: Request) -> None:
        self.requests[req.request_id] = req
        if self.priority:
            self._queue_by_priority(req)
        else:
            self.waiting.append(req)

    def _queue_by_priority(self, req: Request) -> None:
        # After those it ties with: equal keys keep their order (a linear insert: queues are short
        # next to a step's work)
        at = bisect.bisect_right([_urgency(r) for r in self.waiting], _urgency(req))
        self.waiting.insert(at, req)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def may_admit(self) -> bool:
        """Whether the next schedule() may start a waiting request's prompt (a free sequence slot;
        its budget and KV blocks are checked there)."""
        return bool(self.waiting) and len(self.running) < self.max_num_seqs

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_request_ids=self._finished_since_last_step)
        self._finished_since_last_step = []
        budget = self.max_num_batched_tokens
        scoring = self.max_scored_tokens
        now = time.time()

        # 1. Running requests, oldest first; when blocks run out, preempt the newest (the priority
        # policy: the least urgent).
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if req.scores_prompt:
                num_new = min(num_new, scoring)
            if num_new <= 0:
                i += 1
                continue
            # A decode with proposals is a query of 1 + k tokens; the budget counts them all.
            num_spec = min(len(req.spec_token_ids), budget - num_new) if num_new == 1 else 0
            del req.spec_token_ids[num_spec:]
            while True:
                new_blocks = self.kv.allocate_slots(req, num_new, num_lookahead_tokens=num_spec)
                if new_blocks is not None:
                    self._emit(out, req, num_new, new_blocks)
                    budget -= num_new + num_spec
                    scoring -= num_new if req.scores_prompt else 0
                    i += 1
                    break
                if num_spec:  # short of blocks: drop the proposals before preempting anyone
                    num_spec = 0
                    req.spec_token_ids.clear()
                    continue
                at = (max(range(len(self.running)), key=lambda j: _urgency(self.running[j])) if self.priority
                      else len(self.running) - 1)
                victim = self.running.pop(at)
                if at < i:  # the priority policy's victim may have been scheduled this step: its tokens come back
                    i -= 1
                    given_back = next((s for s in out.scheduled if s.request_id == victim.request_id), None)
                    if given_back is not None:
                        budget += len(given_back.token_ids)
                        scoring += len(given_back.token_ids) - given_back.num_spec_tokens if victim.scores_prompt else 0
                self._preempt(victim, now, out)
                if victim is req:
                    break

        # 2. Waiting requests in queue order (arrival; the priority policy: priority, then arrival);
        # stop at the first that does not fit. A request
        # whose adapter finds no slot (max_loras distinct adapters run already) waits, and so do
        # the adapter requests behind it, so the running adapters drain and it gets the next slot;
        # base-model requests need no slot and go on.
        active = {r.lora_int_id for r in self.running if r.lora_int_id}
        skipped: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.lora_int_id and self.max_loras is not None and (skipped or (
                    req.lora_int_id not in active and len(active) >= self.max_loras)):
                skipped.append(self.waiting.popleft())
                continue
            hits, num_hit_tokens = self.kv.get_computed_blocks(req)
            remaining = req.num_tokens - req.num_computed_tokens - num_hit_tokens
            num_new = min(remaining, budget, scoring if req.scores_prompt else budget)
            if num_new <= 0:
                break  # this step's scoring rows are spent: it starts next step, and so do those behind it
            new_blocks = self.kv.allocate_slots(req, num_new, hits)
            if new_blocks is None:
                break
            self.waiting.popleft()
            self.kv.record_prefix_lookup(req, num_hit_tokens)
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit_tokens
            req.num_computed_tokens += num_hit_tokens
            if req.times.first_scheduled is None:
                req.times.first_scheduled = now
                out.new_request_ids.append(req.request_id)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            self._emit(out, req, num_new, new_blocks)
            budget -= num_new
            scoring -= num_new if req.scores_prompt else 0
            if req.lora_int_id:
                active.add(req.lora_int_id)
        self.waiting.extendleft(reversed(skipped))
        return out

    @staticmethod
    def _emit(out: SchedulerOutput, req: Request, num_new: int, new_blocks: list[list[int]]) -> None:
        start = req.num_computed_tokens
        # Rows up to the prompt's second last token score the next prompt token; the last one samples.
        prompt_logits = max(0, min(start + num_new, req.num_prompt_tokens - 1) - start) if req.scores_prompt else 0
        out.scheduled.append(ScheduledRequest(
            request_id=req.request_id,
            token_ids=req.token_ids_slice(start, start + num_new) + req.spec_token_ids,
            start_position=start,
            new_block_ids=new_blocks,
            samples=start + num_new == req.num_tokens,
            num_spec_tokens=len(req.spec_token_ids),
            lora_int_id=req.lora_int_id,
            prompt_logits=prompt_logits,
        ))

    def _preempt(self, req: Request, now: float, out: SchedulerOutput) -> None:
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.spec_token_ids = []
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.times.preemptions.append(now)
        self.num_preemptions_total += 1
        if self.priority:
            self._queue_by_priority(req)  # its arrival stays: ahead of later arrivals of its priority
        else:
            self.waiting.appendleft(req)
        out.preempted_request_ids.append(req.request_id)
        # Its chunk may already be in this step's output if it ran earlier in the loop.
        out.scheduled = [s for s in out.scheduled if s.request_id != req.request_id]

    def update_from_output(self, out: SchedulerOutput, sampled: dict[str, int]) -> None:
        """After the forward pass: every request that ran has its chunk computed,
        and those that sampled (request id -> token id) get their new token.
        Proposals count as computed only once accepted (`accept_draft_token`): the KV slots of
        rejected ones are overwritten by the next step."""
        for sched in out.scheduled:
            req = self.requests.get(sched.request_id)
            if req is None or req.is_finished:
                continue
            req.spec_token_ids = []
            req.num_computed_tokens += len(sched.token_ids) - sched.num_spec_tokens
            token = sampled.get(sched.request_id)
            if token is not None:
                req.output_token_ids.append(token)

    def accept_draft_token(self, request_id: str, token: int) -> None:
        """One more token of a verified run: the token before it was a draft whose KV this step
        wrote, so it counts as computed now, and `token` is the request's next output."""
        req = self.requests[request_id]
        req.num_computed_tokens += 1
        req.output_token_ids.append(token)

    def finish_request(self, request_id: str, status: RequestStatus) -> Request | None:
        """Remove a request (finished or aborted) and free its blocks at once."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = status
        req.times.finished = time.time()
        self.kv.free(req)
        self._finished_since_last_step.append(request_id)
        return req


def _urgency(req: Request) -> tuple[int, float]:
    """The priority policy's order: lower priority values first, then earlier arrivals."""
    return req.sampling_params.priority, req.arrival_time
