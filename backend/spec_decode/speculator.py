"""The engine's side of speculation: which running requests get proposals this step, how many,
and the counters behind `kvserve:spec_decode_*`.

It reads requests by duck typing (prompt/output token ids, sampling params, computed count)
rather than importing the engine: the engine imports this package, not the other way round.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from kvserve.backend.spec_decode.draft_model import DraftModel
from kvserve.backend.spec_decode.ngram_proposer import NgramProposer, propose_from_prediction
from kvserve.backend.spec_decode.spec_config import SpeculativeConfig
from kvserve.backend.spec_decode.spec_policy import Grant, LoadPolicy
from kvserve.backend.spec_decode.suffix_proposer import SuffixProposer

log = logging.getLogger("kvserve.engine")

# On steps the load policy skips the proposer, every this many skips it runs anyway, for shadow
# checks only (Speculator._shadows): the proposer costs ~0.3-0.6 ms a request on SmolLM2's grounded
# prompts against a 17-35 ms step at batch 1, so a quarter of the skipped steps is ~1 % at most.
SHADOW_EVERY_SKIPPED = 4


@dataclass(slots=True)
class SpecDecodeCounters:
    """Running totals, vLLM's spec_decode counters: a draft is one request's proposals in one step."""
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_proposer_errors: int = 0  # steps whose proposals were dropped: plain decoding ran instead
    # accepted_per_position[j]: drafts whose (j+1)-th proposal was accepted (vLLM's _per_pos).
    accepted_per_position: list[int] = field(default_factory=list)


def needs_position_state(params) -> bool:
    """Whether sampling a position depends on the tokens emitted before it (penalties, min_tokens,
    bad words) or needs more than the token (logprobs, bias, allowed ids): then the engine verifies
    position by position through the plain sampler (engine.py `_verify_per_position`) rather than
    all rows at once.
    A grammar needs it too; the engine knows which requests have a matcher."""
    return (params.logprobs is not None or bool(params.logit_bias) or params.min_tokens > 0
            or params.allowed_token_ids is not None or bool(params.bad_words)
            or params.repetition_penalty != 1.0 or params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0)


def make_proposer(config: SpeculativeConfig, draft: DraftModel | None = None) -> NgramProposer | SuffixProposer | DraftModel:
    """The method's proposer: `sync(running)` once a step, then `propose(request, k)` per request
    (the draft model's are placeholders until `Speculator.fill` runs it after the schedule)."""
    if config.method == "draft_model":
        if draft is None:
            raise ValueError("speculative_config.model: the draft model was not loaded")
        return draft
    if config.method == "suffix":
        return SuffixProposer(config.suffix_decoding_max_tree_depth, config.suffix_decoding_max_cached_requests,
                              config.suffix_decoding_max_spec_factor, config.suffix_decoding_min_token_prob)
    return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)


class Speculator:
    def __init__(self, config: SpeculativeConfig, max_model_len: int, max_num_batched_tokens: int,
                 draft: DraftModel | None = None) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = max_num_batched_tokens
        self.proposer = make_proposer(config, draft)
        self.draft = draft
        self.counters = SpecDecodeCounters(accepted_per_position=[0] * config.num_speculative_tokens)
        # "measured": the per-step grant of spec_policy.py; "off": every proposal is verified.
        self.policy = LoadPolicy() if config.load_policy == "measured" else None
        self.last_grant = Grant()
        self.num_skipped_steps = 0  # steps the policy did not even run the proposer (tests, benchmarks)
        self._draft_seconds = 0.0
        # Shadow checks: a proposal's first token that was not verified, checked against the token
        # the step then emits (request id -> (the token's index, the proposed token)). Without
        # them the policy would learn acceptance only from what it grants, and once a low estimate
        # made it grant nothing it would keep that estimate (one proposal per `explore_every`
        # steps moves it slowly). Not for draft_model, whose unverified proposals are placeholders.
        self._shadows: dict[str, tuple[int, int]] = {}
        self._skips_since_shadow = 0

    def propose(self, running, prompt_pending: bool = False) -> None:
        """Set `spec_token_ids` on each running request that decodes next step (one known token
        left to compute), as many as the load policy grants. A proposer fault costs only this
        step's speculation, never a request. `prompt_pending`: the schedule may start a waiting
        request's prompt this step."""
        for req in running:
            req.spec_token_ids = []
        try:
            self._settle_shadows(running)
            self.proposer.sync(running)
            decodes = [req for req in running if req.num_tokens - req.num_computed_tokens == 1]
            if self.policy is not None:
                self.policy.acceptance.forget({req.request_id for req in running})
                if prompt_pending or any(req.num_tokens - req.num_computed_tokens > 1 for req in running):
                    # A step that runs a prompt chunk costs what the prompt's rows cost, which the
                    # policy's lines (fitted on pure-decode steps) cannot price, and its proposals
                    # lost there: offline C=16 on fresh random prompts, of plain decoding, ngram
                    # ~1.02x with them and ~1.04x without, suffix ~0.95x and ~1.01x (BENCHMARKS.md
                    # section 10).
                    self.num_skipped_steps += 1
                    self.last_grant = Grant({}, "a prompt chunk runs this step: not proposing")
                    return
                base = self._base_tokens(running)
                if not self.policy.worth_proposing([r.request_id for r in decodes], base,
                                                   self.config.num_speculative_tokens):
                    self.num_skipped_steps += 1
                    self.last_grant = Grant({}, "a plain step is faster, proposer included: not proposing")
                    self._skips_since_shadow += 1
                    if self.draft is None and self._skips_since_shadow >= SHADOW_EVERY_SKIPPED:
                        self._skips_since_shadow = 0
                        self._propose_in_shadow(decodes)
                    return
            proposals = self._timed_proposals(decodes)
            for req in decodes:
                req.spec_token_ids = proposals[req.request_id]
            if self.policy is not None:
                self._apply_policy(running, base)
        except Exception:  # noqa: BLE001 - any proposer fault: decode plainly this step
            self.counters.num_proposer_errors += 1
            log.exception("speculative proposer failed: this step decodes without proposals")
            for req in running:
                req.spec_token_ids = []

    def _timed_proposals(self, decodes) -> dict[str, list[int]]:
        """Each decoding request's proposals; the proposer's time and hit rate go to the policy."""
        started = time.perf_counter()
        proposals = {req.request_id: self._proposals(req) for req in decodes}
        if self.policy is not None:
            self.policy.observe_proposer(time.perf_counter() - started, len(decodes),
                                         sum(1 for tokens in proposals.values() if tokens))
        return proposals

    def _propose_in_shadow(self, decodes) -> None:
        """Run the proposer on a step the policy skips, only to check its first proposals afterwards
        (timed like any proposer run: its cost and hit rate stay current too)."""
        proposals = self._timed_proposals(decodes)
        for req in decodes:
            if proposals[req.request_id]:
                self._shadows[req.request_id] = (req.num_tokens, proposals[req.request_id][0])

    def _settle_shadows(self, running) -> None:
        """The last step's unverified first proposals against the tokens it emitted: one-proposal
        drafts for the policy's acceptance (a greedy request's token is the one verification would
        have accepted; a sampled one's equals the proposal with the probability it would have
        been accepted, q being one-hot). Not counted in the spec_decode metrics: nothing was verified."""
        shadows, self._shadows = self._shadows, {}
        if self.policy is None or not shadows:
            return
        for req in running:
            shadow = shadows.get(req.request_id)
            if shadow is None or req.num_tokens <= shadow[0]:
                continue  # not running any more, or the step emitted nothing for it (preempted)
            index, proposed = shadow
            emitted = req.output_token_ids[index - len(req.prompt_token_ids)]
            self.policy.observe_draft(req.request_id, 1, int(emitted == proposed))

    def _base_tokens(self, running) -> int:
        # The step's tokens without proposals: one per decode, and the prompt chunks still to run
        # (the budget caps them; waiting requests may add more, which only makes the step costlier).
        left = (req.num_tokens - req.num_computed_tokens for req in running)
        return min(sum(n for n in left if n > 0), self.max_num_batched_tokens)

    def _apply_policy(self, running, base: int) -> None:
        proposals = {req.request_id: len(req.spec_token_ids) for req in running if req.spec_token_ids}
        num_decodes = sum(1 for req in running if req.num_tokens - req.num_computed_tokens == 1)
        self.last_grant = self.policy.grant(proposals, base, num_decodes)
        for req in running:
            if req.spec_token_ids:
                granted = self.last_grant.num_tokens.get(req.request_id, 0)
                if granted == 0 and self.draft is None:
                    self._shadows[req.request_id] = (req.num_tokens, req.spec_token_ids[0])
                del req.spec_token_ids[granted:]

    def fill(self, sched, requests, shape) -> None:
        """After the schedule: the draft model (if it is the method) replaces the placeholders of
        the granted requests with its proposals. A draft fault leaves the placeholders, which
        verification rejects like any wrong guess: the step stays exact."""
        if self.draft is None:
            return
        started = time.perf_counter()
        try:
            self.draft.fill(sched, requests, shape)
        except Exception:  # noqa: BLE001 - the placeholders stand: verification stays exact
            self.counters.num_proposer_errors += 1
            log.exception("draft model failed: this step verifies placeholder proposals")
        self._draft_seconds += time.perf_counter() - started

    def draft_probs(self, request_id: str):
        """q [k, vocab] of this step's draft proposals for a sampled request, else None."""
        return None if self.draft is None else self.draft.probs.get(request_id)

    def reset(self) -> None:
        """After a failed step (the engine failed every request)."""
        if self.draft is not None:
            self.draft.reset()

    def observe_step(self, num_tokens: int, seconds: float, num_spec_tokens: int) -> None:
        """A pure-decode step's query tokens and forward + plain sampling time, for the policy."""
        if self.policy is not None:
            self.policy.observe_step(num_tokens, seconds, num_spec_tokens)

    def observe_verification(self, seconds: float, num_spec_tokens: int) -> None:
        """The step's time spent on its proposals outside the forward: verification (given) and
        the draft's forwards (timed in `fill`), per granted proposal."""
        seconds += self._draft_seconds
        self._draft_seconds = 0.0
        if self.policy is not None and num_spec_tokens:
            self.policy.observe_overhead(seconds, num_spec_tokens)

    def _proposals(self, req) -> list[int]:
        params = req.sampling_params
        if req.num_tokens - req.num_computed_tokens != 1:
            return []
        k = self.config.num_speculative_tokens
        # The step emits up to k + 1 tokens; the drafts sit at positions num_tokens .. num_tokens+k-1.
        if params.max_tokens is not None:
            k = min(k, params.max_tokens - req.num_output_tokens - 1)
        k = min(k, self.max_model_len - req.num_tokens)
        if k <= 0:
            return []
        if len(params.prediction_token_ids) and self.draft is None:  # a draft model's proposals are its own
            predicted = propose_from_prediction(np.asarray(params.prediction_token_ids, dtype=np.int64),
                                                np.asarray(req.output_token_ids, dtype=np.int64), k)
            if predicted:  # else the reply left the prediction: the method's own guess
                return predicted
        return self.proposer.propose(req, k)

    def record(self, request_id: str, num_draft_tokens: int, num_accepted: int) -> None:
        if self.policy is not None:
            self.policy.observe_draft(request_id, num_draft_tokens, num_accepted)
        self.counters.num_drafts += 1
        self.counters.num_draft_tokens += num_draft_tokens
        self.counters.num_accepted_tokens += num_accepted
        for position in range(num_accepted):  # accepted proposals are always a prefix
            self.counters.accepted_per_position[position] += 1
