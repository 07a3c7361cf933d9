"""LLMEngine: one `step()` = schedule, run the model once, sample, detokenize, stop, free.

A user request with n > 1 becomes n child sequences. They share the prompt's KV
blocks through the prefix hash index (with caching off, a per-parent cache key
lets only the siblings share).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from kvserve.backend.engine.admission import AdmittedPrompt, PromptLimits, admit
from kvserve.backend.engine.config import EngineConfig
from kvserve.backend.engine.detokenizer import IncrementalDetokenizer
from kvserve.backend.engine.engine_tokenizer import load_engine_tokenizer
from kvserve.backend.engine.outputs import CompletionOutput, EngineStats, RequestMetrics, RequestOutput, TokenLogprob
from kvserve.backend.engine.request import Request, RequestStatus
from kvserve.backend.engine.sampler import SampledToken, Sampler, SamplingRow, draw_row, target_logits
from kvserve.backend.engine.sampling_params import SamplingParams
from kvserve.backend.engine.scheduler import Scheduler
from kvserve.backend.kv_cache import KVCacheManager
from kvserve.backend.lora import LoRAError, LoRARegistry, LoRARequest
from kvserve.backend.spec_decode import (Speculator, load_draft, needs_position_state, parse_speculative_config,
                                         verify_proposals, verify_with_draft_probs)
from kvserve.backend.structured import GrammarCompiler, GrammarMatchers
from kvserve.backend.worker import ModelRunner
from kvserve.seam.error_wire import ErrorKind, invalid

log = logging.getLogger("kvserve.engine")

_PROMPT_SCORE_ROWS = 256  # prompt rows scored at a time


@dataclass(slots=True)
class _Sequence:
    """Engine-side companions of one child Request."""
    request: Request
    parent_id: str
    index: int
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator | None
    pending_text: str = ""
    pending_ids: list[int] = field(default_factory=list)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    reported_finish: bool = False


@dataclass(slots=True)
class _Group:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    children: list[str]
    traceparent: str | None = None
    lora: LoRARequest | None = None  # pinned in the registry until the group is dropped
    finished_children: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    prefilled: bool = False  # its prompt tokens were counted (once per request, whatever n)
    # prompt_logprobs: per prompt token, its logprob given those before it (None for the first),
    # filled as its first child's prompt chunks run; handed out once, on the first output after.
    prompt_logprobs: list[TokenLogprob | None] | None = None
    prompt_logprobs_sent: bool = False


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.runner = ModelRunner(config)
        self.tokenizer = load_engine_tokenizer(config.tokenizer or config.model)
        self.max_model_len = self.runner.max_model_len
        self.vocab_size = self.runner.arch.vocab_size
        self.eos_token_ids = self.tokenizer.eos_token_ids or frozenset(self.runner.arch.eos_token_ids)
        self.limits = PromptLimits(self.vocab_size, self.max_model_len, self.tokenizer.max_chars_per_token,
                                   priority_scheduling=config.scheduling_policy == "priority")
        self.kv = KVCacheManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching,
                                 self.runner.kv_groups)
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.max_loras if config.enable_lora else None, self.vocab_size,
                                   priority=config.scheduling_policy == "priority")
        # LoRA adapters (backend/lora/): the registry any thread adds to, and the runner's slots read.
        self.loras: LoRARegistry | None = None
        self.lora_finished: dict[str, int] = {}  # adapter name -> requests ended (metrics)
        if config.enable_lora:
            self.loras = LoRARegistry(self.runner.load_lora, config.max_cpu_loras or config.max_loras)
            self.runner.lora_lookup = self.loras.pinned
        self.sampler = Sampler()
        spec_config = parse_speculative_config(config.speculative_config)
        self.speculator = None
        if spec_config is not None:
            draft = None if spec_config.method != "draft_model" else load_draft(
                spec_config, config, self.runner, self.tokenizer, load_engine_tokenizer)
            self.speculator = Speculator(spec_config, self.max_model_len, config.max_num_batched_tokens, draft)
        self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
        self.matchers = GrammarMatchers(self.vocab_size)
        self.groups: dict[str, _Group] = {}
        self.sequences: dict[str, _Sequence] = {}
        # Token counters for metrics; the engine thread is the only writer.
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        # Inter-token gaps since the last stats() (which hands them on).
        self._inter_token_gaps: list[float] = []
        self._iteration_tokens: list[int] = []  # tokens each step ran, until stats() takes them
        self._verify_seconds = 0.0  # the last step's verification time (the speculation policy's)

    # ---- admission -------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int] | AdmittedPrompt, params: SamplingParams,
                    arrival_time: float | None = None, traceparent: str | None = None,
                    compiled_grammar=None, lora_request: LoRARequest | None = None) -> None:
        """A prompt not yet admitted (the offline LLM API) is admitted here; the AsyncEngine
        admits off this thread and passes the `AdmittedPrompt`. Likewise `compiled_grammar`:
        the AsyncEngine compiles off this thread; without it a constrained request is compiled here."""
        if request_id in self.groups:
            raise invalid("request_id", "a request with this id is already in flight")
        if lora_request is not None:
            self._check_lora_enabled()
        if not isinstance(prompt, AdmittedPrompt):
            prompt = admit(prompt, params, self.limits, self.tokenizer.encode)
        ids = prompt.token_ids
        if params.grammar is not None and compiled_grammar is None:
            compiled_grammar = self.grammars.compile(params.grammar)
        group = _Group(request_id, prompt.text, ids, params, [], traceparent=traceparent, lora=lora_request)
        if params.prompt_logprobs is not None:
            group.prompt_logprobs = [None]
        arrival = arrival_time or time.time()
        if self.config.enable_prefix_caching:
            cache_key = params.cache_salt or ""
        else:
            cache_key = f"siblings:{request_id}" if params.n > 1 else None
        # Build every child before registering any: a failure half-way (e.g. a bad
        # seed) must not leave orphan children in the scheduler, where they would
        # break every later step (their group would be missing).
        children: list[_Sequence] = []
        for i in range(params.n):
            child_id = request_id if params.n == 1 else f"{request_id}#{i}"
            req = Request(child_id, ids, params, eos_token_ids=self.eos_token_ids, cache_key=cache_key,
                          lora_int_id=lora_request.lora_int_id if lora_request else 0,
                          lora_name=lora_request.lora_name if lora_request else None)
            req.times.arrival = arrival
            req.no_prefix_reads = params.prompt_logprobs is not None and len(ids) > 1
            req.scores_prompt = req.no_prefix_reads and i == 0
            generator = None
            if params.seed is not None and not params.greedy:
                generator = torch.Generator(device=self.runner.device).manual_seed(_torch_seed(params.seed + i))
            detok = IncrementalDetokenizer(self.tokenizer, ids, params.stop, params.include_stop_str_in_output,
                                           params.skip_special_tokens)
            children.append(_Sequence(req, request_id, i, detok, generator))
        if lora_request is not None:  # last of what may fail: an unknown (or unloaded) adapter
            self.loras.pin(lora_request)
        for seq in children:
            if compiled_grammar is not None:
                self.matchers.add(seq.request.request_id, compiled_grammar)
            self.sequences[seq.request.request_id] = seq
            group.children.append(seq.request.request_id)
            self.scheduler.add_request(seq.request)
        self.groups[request_id] = group

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its blocks; returns its final (aborted) output."""
        return self._finish_group(request_id, RequestStatus.FINISHED_ABORTED)

    def fail(self, request_id: str, message: str, kind: ErrorKind = ErrorKind.INTERNAL,
             param: str | None = None) -> RequestOutput | None:
        out = self._finish_group(request_id, RequestStatus.FINISHED_ERROR)
        if out is not None:
            out.error, out.error_kind, out.error_param = message, kind, param
        return out

    def _finish_group(self, request_id: str, status: RequestStatus) -> RequestOutput | None:
        group = self.groups.get(request_id)
        if group is None:
            return None
        outputs = []
        for child_id in group.children:
            seq = self.sequences[child_id]
            if self.config.debug.log_scheduling and not seq.reported_finish:
                state = "running" if seq.request.times.first_scheduled is not None else "never scheduled"
                log.info("request %s ended (%s): %s", child_id, status.value, state)
            if not seq.reported_finish:
                self.scheduler.finish_request(child_id, status)
                outputs.append(self._take_delta(seq, status.value))
        cached = self._cached_tokens(group)
        metrics = self._group_metrics(group)
        self._drop_group(group)
        return RequestOutput(request_id, group.prompt_token_ids, outputs, finished=True,
                             num_cached_tokens=cached, prompt=group.prompt, metrics=metrics)

    # ---- the step --------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return bool(self.groups)

    def step(self) -> list[RequestOutput]:
        outputs = self._expire_timeouts()
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running, prompt_pending=self.scheduler.may_admit())
        sched = self.scheduler.schedule()
        if self.speculator is not None:  # the draft model's proposals, in the slots just allocated
            self.speculator.fill(sched, self.scheduler.requests, self._draft_shape)
        if self.config.debug.log_scheduling:
            for rid in sched.new_request_ids:
                log.info("request %s scheduled", rid)
        if sched.is_empty:
            self.runner.update_block_tables(sched)  # it still forgets the finished ones
            return outputs
        started = time.perf_counter()
        num_tokens = sum(len(s.token_ids) for s in sched.scheduled)
        self._iteration_tokens.append(num_tokens)
        logits, sample_ids = self.runner.execute(sched)
        if sched.scores_prompts:
            logits = self._score_prompts(logits, sched)
        seqs = [self.sequences[rid] for rid in sample_ids]
        sampled, runs = self._sample(logits, sched, sample_ids, seqs)
        if self.speculator is not None:
            num_spec = sum(s.num_spec_tokens for s in sched.scheduled)
            self.speculator.observe_verification(self._verify_seconds, num_spec)
            if _is_pure_decode(sched):  # the forward and the plain sampling: verification is apart
                self.speculator.observe_step(num_tokens,
                                             time.perf_counter() - started - self._verify_seconds, num_spec)
        accepted: list[tuple[_Sequence, object]] = []
        refused: list[str] = []
        for seq, tok in zip(seqs, sampled):
            if tok.token_id >= 0 and self.matchers.accept(seq.request.request_id, tok.token_id):
                accepted.append((seq, tok))
            else:
                refused.append(seq.parent_id)  # the grammar allowed nothing (e.g. min_tokens banned its end)
        self.scheduler.update_from_output(sched, {seq.request.request_id: tok.token_id for seq, tok in accepted})
        if not seqs:
            return outputs
        now = time.time()
        touched: dict[str, list[CompletionOutput]] = {}
        num_extra = 0
        for seq, tok in accepted:
            rid = seq.request.request_id
            finish = self._append_token(seq, tok, now)
            # The rest of a verified speculative run, token by token: a stop (EOS, stop string,
            # max_tokens) inside it ends the request there and the tokens after it are dropped.
            for extra in runs.get(rid, ()):
                if finish is not None:
                    break
                self.scheduler.accept_draft_token(rid, extra.token_id)
                self.matchers.accept(rid, extra.token_id)  # verified against this matcher: it accepts
                finish = self._append_token(seq, extra, now)
                num_extra += 1
            if finish is None and self.matchers.is_terminated(rid):
                finish = RequestStatus.FINISHED_STOPPED  # the grammar ended: nothing more may follow
            if finish is not None:
                self.scheduler.finish_request(rid, finish)
                self.matchers.free(rid)
            delta = self._take_delta(seq, finish.value if finish else None)
            touched.setdefault(seq.parent_id, []).append(delta)
        self.generation_tokens_total += len(sampled) - len(refused) + num_extra
        for parent_id in dict.fromkeys(refused):
            touched.pop(parent_id, None)
            field_name = ("structured_outputs" if self.groups[parent_id].params.structured_outputs is not None
                          else "allowed_token_ids")
            out = self.fail(parent_id, f"{field_name}: the constraint allowed no token here "
                                       "(min_tokens, logit_bias, bad_words or ignore_eos conflict with it)",
                            ErrorKind.INVALID, field_name)
            if out is not None:
                outputs.append(out)
        for parent_id, deltas in touched.items():
            group = self.groups[parent_id]
            done = group.finished_children == len(group.children)
            outputs.append(RequestOutput(parent_id, group.prompt_token_ids, deltas, finished=done,
                                         num_cached_tokens=self._cached_tokens(group), prompt=group.prompt,
                                         metrics=self._group_metrics(group) if done else None,
                                         prompt_logprobs=self._take_prompt_logprobs(group)))
            if done:
                self._drop_group(group)
        return outputs

    def _score_prompts(self, logits: torch.Tensor, sched) -> torch.Tensor:
        """Take the prompt-scoring rows out of a step's logits (the runner's layout: request by
        request, its prompt rows, then its sampling rows) into their groups' prompt logprobs;
        returns the sampling rows. Raw logprobs (before temperature, penalties or bias), as vLLM's."""
        keep: list[int] = []
        row = 0
        for s in sched.scheduled:
            if s.prompt_logits:
                self._record_prompt_logprobs(s, logits[row:row + s.prompt_logits])
                row += s.prompt_logits
            if s.samples:
                keep.extend(range(row, row + 1 + s.num_spec_tokens))
                row += 1 + s.num_spec_tokens
        return logits[keep]

    def _record_prompt_logprobs(self, s, rows: torch.Tensor) -> None:
        seq = self.sequences[s.request_id]
        group, req = self.groups[seq.parent_id], seq.request
        scored = group.prompt_logprobs
        k = group.params.prompt_logprobs
        targets = req.prompt_token_ids[s.start_position + 1:s.start_position + 1 + len(rows)]
        # Slices bound the float32 copy log_softmax makes (a chunk of a large vocabulary is big).
        for first in range(0, len(rows), _PROMPT_SCORE_ROWS):
            part = rows[first:first + _PROMPT_SCORE_ROWS].log_softmax(dim=-1)
            ids = targets[first:first + _PROMPT_SCORE_ROWS]
            chosen_t = part.gather(1, torch.tensor(ids, device=part.device).unsqueeze(1))
            # Counted in int32: a bool tensor's default sum (into int64) took twice as long here.
            ranks = ((part > chosen_t).sum(dim=1, dtype=torch.int32) + 1).tolist()
            chosen = chosen_t.squeeze(1).tolist()
            tops: list[list[tuple[int, float]]] = [[] for _ in ids]
            if k:
                values, top_ids = part.topk(k, dim=-1)
                tops = [list(zip(i, v)) for i, v in zip(top_ids.tolist(), values.tolist())]
            for j, (token, logprob, top, rank) in enumerate(zip(ids, chosen, tops, ranks)):
                # Position p's entry is index p; a chunk run again after a preemption adds nothing.
                if s.start_position + 1 + first + j == len(scored):
                    scored.append(TokenLogprob(token, logprob, top, rank))
        if len(scored) == req.num_prompt_tokens:
            req.scores_prompt = False
            for child_id in group.children:  # all there: a preempted child may read the prefix cache again
                self.sequences[child_id].request.no_prefix_reads = False

    @staticmethod
    def _take_prompt_logprobs(group: _Group) -> list[TokenLogprob | None] | None:
        """A group's prompt logprobs, once, when all of them are there (with its first token)."""
        if group.prompt_logprobs_sent or group.prompt_logprobs is None \
                or len(group.prompt_logprobs) < len(group.prompt_token_ids):
            return None
        group.prompt_logprobs_sent = True
        return group.prompt_logprobs

    def _sample(self, logits, sched, sample_ids: list[str],
                seqs: list[_Sequence]) -> tuple[list[SampledToken], dict[str, list[SampledToken]]]:
        """One token per sampling request (aligned with `seqs`), and for each request that
        verified proposals, the tokens of its run after that first one.

        A request with k proposals owns 1 + k consecutive logits rows; the others own one."""
        self._verify_seconds = 0.0
        if not seqs:
            return [], {}
        verifying = {s.request_id: s for s in sched.scheduled if s.samples and s.num_spec_tokens}
        num_spec = {rid: s.num_spec_tokens for rid, s in verifying.items()}
        row_of, row = [], 0
        for rid in sample_ids:
            row_of.append(row)
            row += 1 + num_spec.get(rid, 0)
        plain = [i for i, rid in enumerate(sample_ids) if rid not in num_spec]
        sampled: list[SampledToken | None] = [None] * len(seqs)
        if plain:
            rows = [self._sampling_row(seqs[i]) for i in plain]
            plain_logits = logits if not num_spec else logits[[row_of[i] for i in plain]]
            for i, tok in zip(plain, self.sampler(plain_logits, rows, self.matchers.mask_for(
                    [sample_ids[i] for i in plain]))):
                sampled[i] = tok
        runs: dict[str, list[SampledToken]] = {}
        started = time.perf_counter()
        for i, rid in enumerate(sample_ids):
            k = num_spec.get(rid, 0)
            if not k:
                continue
            seq, drafts = seqs[i], verifying[rid].token_ids[-k:]
            rows = logits[row_of[i]:row_of[i] + 1 + k]
            greedy = seq.request.sampling_params.greedy
            if needs_position_state(seq.request.sampling_params) or rid in self.matchers:
                # Exact for any proposals, a draft model's sampled ones too: each position's token is
                # drawn from p itself, and the draft is only compared with it.
                run = self._verify_per_position(seq, rows, drafts)
            else:
                row = self._sampling_row(seq)
                target = target_logits(rows, [row] * (1 + k))
                q = None if greedy else self.speculator.draft_probs(rid)
                if q is not None:  # a draft model's sampled proposals: min(1, p/q), residual max(0, p - q)
                    run = [SampledToken(t) for t in verify_with_draft_probs(target, drafts, q, seq.generator)]
                else:
                    run = [SampledToken(t) for t in verify_proposals(
                        target, drafts, greedy, lambda scaled, row=row: draw_row(scaled, row))]
            self.speculator.record(rid, len(drafts), len(run) - 1)
            sampled[i], runs[rid] = run[0], run[1:]
        self._verify_seconds = time.perf_counter() - started
        return sampled, runs

    def _draft_shape(self, request_id: str, logits):
        """For the draft model: the logits a request's plain sampling would draw from (None for a
        greedy request), and its generator."""
        seq = self.sequences[request_id]
        if seq.request.sampling_params.greedy:
            return None, None
        return target_logits(logits, [self._sampling_row(seq)]), seq.generator

    def _verify_per_position(self, seq: _Sequence, rows, drafts: list[int]) -> list[SampledToken]:
        """Verification for a request whose sampling depends on what it emitted so far: each
        position is sampled by the plain sampler itself, as the step after the accepted drafts
        before it would sample it (penalties and min_tokens over output + accepted drafts, its
        bias, its grammar's mask in the state after those drafts, the raw logprobs of that
        position). A draft is accepted when that token is the draft; the first other token ends
        the run. So every emitted token, and its logprobs, is what plain decoding would give.

        The grammar matcher advances through the accepted drafts to mask the next position, and
        is rolled back afterwards: the step replays the run's tokens into it as it appends them,
        stopping where a stop ends the request."""
        rid, req = seq.request.request_id, seq.request
        run: list[SampledToken] = []
        advanced = 0
        try:
            for j in range(len(drafts) + 1):
                row = SamplingRow(req.sampling_params, req.prompt_token_ids, req.output_token_ids + [
                    t.token_id for t in run], seq.generator, req.eos_token_ids)
                tok = self.sampler(rows[j:j + 1], [row], self.matchers.mask_for([rid]))[0]
                if tok.token_id < 0 and j > 0:
                    break  # the grammar allows nothing after the accepted drafts: the next step says so
                run.append(tok)
                if j == len(drafts) or tok.token_id != drafts[j]:
                    break
                if rid in self.matchers:
                    self.matchers.accept(rid, tok.token_id)
                    advanced += 1
                    if self.matchers.is_terminated(rid):
                        break  # the grammar ended on this draft: plain decoding would stop here too
        finally:
            self.matchers.rollback(rid, advanced)
        return run

    @staticmethod
    def _sampling_row(seq: _Sequence) -> SamplingRow:
        r = seq.request
        return SamplingRow(r.sampling_params, r.prompt_token_ids, r.output_token_ids, seq.generator, r.eos_token_ids)

    def _count_prompt_tokens(self, seq: _Sequence) -> None:
        # At the first token, not on arrival: a request aborted while it waited was never
        # prefilled, and n > 1 samples share one prompt (as the response's usage counts it).
        group = self.groups[seq.parent_id]
        if not group.prefilled:
            group.prefilled = True
            self.prompt_tokens_total += len(group.prompt_token_ids)

    def _append_token(self, seq: _Sequence, tok, now: float) -> RequestStatus | None:
        """The scheduler has appended `tok` (update_from_output): time it, detokenize it, check stops."""
        req, params = seq.request, seq.request.sampling_params
        if req.times.first_token is None:
            req.times.first_token = now
            self._count_prompt_tokens(seq)
        else:
            self._inter_token_gaps.append(now - req.times.last_token)
        req.times.last_token = now
        seq.pending_ids.append(tok.token_id)
        if tok.logprob is not None:
            seq.pending_logprobs.append(TokenLogprob(tok.token_id, tok.logprob, tok.top_logprobs or []))
        n_out = req.num_output_tokens
        stop_token = n_out >= params.min_tokens and (
            tok.token_id in params.stop_token_ids or (not params.ignore_eos and tok.token_id in req.eos_token_ids))
        if stop_token:
            req.stop_reason = tok.token_id if tok.token_id in params.stop_token_ids else None
            # The stop token is in token_ids but, as in vLLM, not in the text.
            if params.include_stop_str_in_output:
                seq.pending_text += seq.detokenizer.add_tokens([tok.token_id], finished=True).text_delta
            else:
                seq.pending_text += seq.detokenizer.add_tokens([], finished=True).text_delta
            return RequestStatus.FINISHED_STOPPED
        length_done = (params.max_tokens is not None and n_out >= params.max_tokens) or \
            req.num_tokens >= self.max_model_len
        result = seq.detokenizer.add_tokens([tok.token_id], finished=length_done,
                                            check_stop=n_out >= params.min_tokens)
        seq.pending_text += result.text_delta
        if result.stop_string is not None:
            req.stop_reason = result.stop_string
            return RequestStatus.FINISHED_STOPPED
        if length_done:
            if seq.detokenizer.has_held_text:
                seq.pending_text += seq.detokenizer.add_tokens([], finished=True).text_delta
            return RequestStatus.FINISHED_LENGTH
        return None

    def _take_delta(self, seq: _Sequence, finish_reason: str | None) -> CompletionOutput:
        params = seq.request.sampling_params
        out = CompletionOutput(index=seq.index, text=seq.pending_text, token_ids=seq.pending_ids,
                               finish_reason=finish_reason,
                               stop_reason=seq.request.stop_reason if finish_reason else None,
                               logprobs=seq.pending_logprobs if params.logprobs is not None else None)
        seq.pending_text, seq.pending_ids, seq.pending_logprobs = "", [], []
        if finish_reason is not None and not seq.reported_finish:
            seq.reported_finish = True
            group = self.groups[seq.parent_id]
            group.finished_children += 1
            group.finish_reasons.append(finish_reason)
        return out

    def _expire_timeouts(self) -> list[RequestOutput]:
        now = time.time()
        expired = [g.request_id for g in self.groups.values()
                   if g.params.timeout is not None
                   and now - self.sequences[g.children[0]].request.times.arrival > g.params.timeout]
        outs = []
        for rid in expired:
            out = self.fail(rid, f"timeout: the request did not finish within {self.groups[rid].params.timeout} s",
                            ErrorKind.TIMEOUT)
            if out is not None:
                outs.append(out)
        return outs

    def _group_metrics(self, group: _Group) -> RequestMetrics:
        reqs = [self.sequences[c].request for c in group.children]
        first = reqs[0].times
        scheduled = [r.times.first_scheduled for r in reqs if r.times.first_scheduled is not None]
        tokens = [r.times.first_token for r in reqs if r.times.first_token is not None]
        return RequestMetrics(
            arrival=first.arrival, first_scheduled=min(scheduled) if scheduled else None,
            first_token=min(tokens) if tokens else None,
            finished=max((r.times.finished or time.time()) for r in reqs),
            preemptions=sorted(t for r in reqs for t in r.times.preemptions),
            num_prompt_tokens=len(group.prompt_token_ids),
            num_generated_tokens=sum(r.num_output_tokens for r in reqs),
            finish_reasons=list(group.finish_reasons), traceparent=group.traceparent,
            n=group.params.n, max_tokens=group.params.max_tokens,
            max_choice_tokens=max((r.num_output_tokens for r in reqs), default=0))

    def _cached_tokens(self, group: _Group) -> int:
        return max(self.sequences[group.children[0]].request.num_cached_tokens, 0)

    def _drop_group(self, group: _Group) -> None:
        for child_id in group.children:
            self.sequences.pop(child_id, None)
            self.matchers.free(child_id)
        if self.groups.pop(group.request_id, None) is not None and group.lora is not None:
            self.loras.unpin(group.lora.lora_int_id)
            name = group.lora.lora_name
            self.lora_finished[name] = self.lora_finished.get(name, 0) + 1

    # ---- LoRA adapters (any thread: the registry has its own lock) -----------------------------
    def _check_lora_enabled(self) -> None:
        if self.loras is None:
            raise LoRAError("LoRA adapters are off: start the engine with --enable-lora (enable_lora=True)")

    def _registered(self, lora_name: str) -> LoRARegistry:
        """The registry, for a lookup by name: with LoRA off, no name is an adapter's."""
        if self.loras is None:
            raise LoRAError(f"adapter {lora_name!r} is not loaded (LoRA is off: --enable-lora)", not_found=True)
        return self.loras

    def add_lora(self, lora: LoRARequest) -> None:
        """Read, check and register an adapter; the same name and path again is a no-op."""
        self._check_lora_enabled()
        self.loras.add(lora)

    def remove_lora(self, lora_name: str) -> None:
        """Unregister an adapter; requests already running with it finish with it."""
        self._registered(lora_name).remove(lora_name)

    def list_loras(self) -> list[LoRARequest]:
        return [] if self.loras is None else self.loras.list()

    def resolve_lora(self, lora_name: str) -> LoRARequest:
        return self._registered(lora_name).resolve(lora_name)

    # ---- introspection for metrics, tests and the async wrapper ------------------------------
    def stats(self) -> EngineStats:
        """Now's gauges and totals, with the inter-token gaps and the steps' token counts since the
        previous call (engine thread)."""
        gaps, self._inter_token_gaps = self._inter_token_gaps, []
        iterations, self._iteration_tokens = self._iteration_tokens, []
        return EngineStats(
            num_requests_running=self.scheduler.num_running,
            num_requests_waiting=self.scheduler.num_waiting,
            kv_cache_usage_perc=self.kv.usage(),
            num_free_blocks=self.kv.num_free_blocks,
            num_usable_blocks=self.kv.num_usable_blocks,
            num_preemptions_total=self.scheduler.num_preemptions_total,
            prefix_cache_queries_total=self.kv.prefix_queries,
            prefix_cache_hits_total=self.kv.prefix_hits,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            num_grammar_matchers=len(self.matchers),
            kv_cache_touched_bytes=self.kv.num_touched_blocks * self.runner.block_bytes,
            inter_token_gaps=tuple(gaps),
            iteration_tokens=tuple(iterations),
            lora_running=_adapter_names(self.scheduler.running),
            lora_waiting=_adapter_names(self.scheduler.waiting),
            lora_requests_finished_total=tuple(sorted(self.lora_finished.items())),
            **self._spec_decode_totals(),
        )

    def _spec_decode_totals(self) -> dict[str, int]:
        if self.speculator is None:
            return {}
        c = self.speculator.counters
        return {"spec_decode_num_drafts_total": c.num_drafts, "spec_decode_num_draft_tokens_total": c.num_draft_tokens,
                "spec_decode_num_accepted_tokens_total": c.num_accepted_tokens,
                "spec_decode_proposer_errors_total": c.num_proposer_errors,
                "spec_decode_accepted_per_position_total": tuple(c.accepted_per_position)}

    def reset_prefix_cache(self) -> int:
        """vLLM's reset_prefix_cache (after new weights, or between benchmark runs): no later request
        reuses a prefix computed before it; requests running now keep their blocks and go on.
        Returns how many cached blocks were forgotten."""
        forgotten = self.kv.reset_prefix_cache()
        log.info("prefix cache reset: %d cached blocks forgotten", forgotten)
        return forgotten

    def recover_from_fault(self, message: str) -> list[RequestOutput]:
        """After a failed forward pass: fail every in-flight request and forget possibly unwritten prefixes."""
        outs = [o for rid in list(self.groups) if (o := self.fail(rid, message)) is not None]
        # Defensive: a scheduler entry without a sequence would fail every later step.
        for rid in [r for r in self.scheduler.requests if r not in self.sequences]:
            self.scheduler.finish_request(rid, RequestStatus.FINISHED_ERROR)
        self.kv.reset_prefix_cache()
        self.runner.reset_block_tables()
        if self.speculator is not None:
            self.speculator.reset()
        return outs


_SEED_SPAN = 2**64


def _is_pure_decode(sched) -> bool:
    """Every scheduled request runs its one new token (and its proposals): the steps the
    speculation policy's cost line is fitted on."""
    return all(s.samples and len(s.token_ids) - s.num_spec_tokens == 1 for s in sched.scheduled)


def _adapter_names(requests) -> tuple[str, ...]:
    return tuple(dict.fromkeys(r.lora_name for r in requests if r.lora_name is not None))


def _torch_seed(seed: int) -> int:
    """torch seeds are 64-bit; seed + child index may pass 2**64 - 1, so wrap it."""
    return seed - _SEED_SPAN if seed >= _SEED_SPAN else seed
