"""How many proposals each request verifies this step, decided from measured cost.

Verifying k proposals makes a decode query of 1 + k tokens. When the batch is small the step is
bound by reading the weights and the extra tokens are nearly free; when it is full the step is
compute-bound and every extra token costs about as much as a real one. So the grant is not a
fixed switch but a per-step choice that maximises expected emitted tokens per second of step:

    rate(grant) = (B + sum_r E_r(k_r)) / cost(n0 + sum_r k_r)

- cost(n): the step's wall time at n query tokens, a least-squares line a + b*n over the recent
  pure-decode steps (StepCostModel). Pure decode only: a prefill chunk's cost is dominated by
  attention over the prompt, not by what a decode token costs.
- E_r(k) = a_r + a_r^2 + ... + a_r^k: the expected accepted proposals when each proposal after
  an accepted one is accepted with probability a_r (AcceptanceModel: the method's measured
  conditional acceptance, refined by the request's own record).

The j-th proposal of a request adds a_r^j expected tokens and costs b; the gains only shrink with
j, so granting proposals best gain first, while the rate still rises, reaches the best grant. The
rate rises with a gain g at tokens E and cost t exactly when g > E * b / t: at batch 1 with a
weight-bound step (b << a) almost any proposal pays; at a full, compute-bound batch (a + b*n
dominated by b*n) only gains near 1 do, and with E >= n no gain below 1 does.

What speculation costs besides the forward is counted too (issue 32: at 16 requests on random
text the forward-only line granted proposals that lost 12-15% throughput):
- v, the seconds per granted proposal spent outside the forward: the verification (the target's
  scaling and the rejection rule, request by request; the position-by-position sampler) and, for
  `draft_model`, the draft's forwards. Each granted token costs b + v, not b.
- p, the proposer's seconds per decoding request it looks at (n-gram lookup, the suffix trees),
  paid every step speculation is on, whatever is granted; and h, the share of those requests that
  get a proposal at all.
- The step without proposals is timed apart (`plain`): on the CPU a step of one-token queries runs
  the native decode step (worker/native_decode.py) and a step with any proposal the per-op path,
  so the first granted token costs a jump that no line through both kinds of step shows.

Before proposing, `worth_proposing` asks whether, at the method's rates, the best grant for the
decoding requests would emit more tokens per second than a plain step, p and h included; when it
would not, the proposer does not even run. After proposing, `grant` picks the proposals (marginal
cost b + v, the proposer's time being spent already) and grants none when the plain step is still
faster.

Before the cost model has seen enough steps at different sizes to fit a line, the grant is the
full proposal: that is what produces the varied step sizes it learns from. Once a grant of zero
becomes the rule, an occasional exploring step (one proposal per request, every
`explore_every` steps) keeps both estimates from going stale when the load changes.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

MIN_FIT_STEPS = 8  # pure-decode steps before the line is trusted
MIN_SIZE_SPREAD = 2.0  # the line needs steps whose token counts differ by at least this much
MIN_SAME_SIZE = 3  # steps of one size whose mean stands for that size's cost


class StepCostModel:
    """Step wall time as a line in the number of query tokens, over the last `window` steps."""

    def __init__(self, window: int = 256) -> None:
        self._steps: deque[tuple[int, float]] = deque(maxlen=window)
        # The last line the window could fit: a steady load (every step the same size, which a
        # grant of zero makes the rule) tells nothing new, so the line it had stands.
        self._last_line: tuple[float, float] | None = None

    def observe(self, num_tokens: int, seconds: float) -> None:
        if num_tokens > 0 and seconds > 0:
            self._steps.append((num_tokens, seconds))

    def estimate(self, num_tokens: int) -> float | None:
        """The cost of a step of `num_tokens`: the mean of the recent steps of that very size when
        there are a few (no line needed), else the line's value, else None."""
        same = [t for n, t in self._steps if n == num_tokens]
        if len(same) >= MIN_SAME_SIZE:
            return sum(same) / len(same)
        line = self.line()
        return None if line is None else line[0] + line[1] * num_tokens

    def line(self) -> tuple[float, float] | None:
        """(fixed seconds per step, seconds per token), or None while the data cannot tell them apart."""
        if len(self._steps) < MIN_FIT_STEPS:
            return self._last_line
        ns = [n for n, _ in self._steps]
        if max(ns) - min(ns) < MIN_SIZE_SPREAD:
            return self._last_line
        count = len(ns)
        mean_n = sum(ns) / count
        mean_t = sum(t for _, t in self._steps) / count
        var = sum((n - mean_n) ** 2 for n in ns)
        cov = sum((n - mean_n) * (t - mean_t) for n, t in self._steps)
        # A token never makes a step cheaper; timing noise can make the fitted slope negative.
        per_token = max(cov / var, 0.0)
        fixed = max(mean_t - per_token * mean_n, 0.0)
        self._last_line = (fixed, per_token)
        return self._last_line


class UnitCost:
    """Seconds per unit (a request looked at, a token granted), decayed so it follows the load."""

    def __init__(self, decay: float = 0.98) -> None:
        self.decay = decay
        self._seconds = 0.0
        self._units = 0.0

    def observe(self, seconds: float, units: int) -> None:
        if units > 0 and seconds >= 0:
            self._seconds = self._seconds * self.decay + seconds
            self._units = self._units * self.decay + units

    @property
    def per_unit(self) -> float:
        return self._seconds / self._units if self._units else 0.0


@dataclass(slots=True)
class _Record:
    accepted: int = 0
    rejected: int = 0


class AcceptanceModel:
    """P(the next proposal is accepted | the ones before it were): the method's rate, decayed so
    it follows the workload, and each request's own record shrunk towards it."""

    def __init__(self, prior: float = 0.5, decay: float = 0.995, prior_weight: float = 4.0,
                 request_weight: float = 4.0) -> None:
        self.decay = decay
        # How many proposals of evidence the method's rate counts as, against a request's own.
        self.request_weight = request_weight
        # Start as if `prior_weight` proposals had been seen at `prior`.
        self._accepted = prior * prior_weight
        self._seen = prior_weight
        self._requests: dict[str, _Record] = {}

    @property
    def method_rate(self) -> float:
        return self._accepted / self._seen

    def observe(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        """One verified draft: `num_accepted` proposals were accepted, then one rejected unless all were."""
        if num_drafts <= 0:
            return
        rejected = 1 if num_accepted < num_drafts else 0
        self._accepted = self._accepted * self.decay + num_accepted
        self._seen = self._seen * self.decay + num_accepted + rejected
        rec = self._requests.setdefault(request_id, _Record())
        rec.accepted += num_accepted
        rec.rejected += rejected

    def rate(self, request_id: str) -> float:
        rec = self._requests.get(request_id)
        if rec is None:
            return self.method_rate
        w = self.request_weight
        return (rec.accepted + w * self.method_rate) / (rec.accepted + rec.rejected + w)

    def forget(self, live_ids: set[str]) -> None:
        for rid in [rid for rid in self._requests if rid not in live_ids]:
            del self._requests[rid]


@dataclass(slots=True)
class Grant:
    """The policy's answer for one step: proposals to keep per request, and why (for the span)."""
    num_tokens: dict[str, int] = field(default_factory=dict)
    reason: str = ""


class LoadPolicy:
    def __init__(self, explore_every: int = 64, cost: StepCostModel | None = None,
                 acceptance: AcceptanceModel | None = None, plain: StepCostModel | None = None,
                 proposer: UnitCost | None = None, overhead: UnitCost | None = None) -> None:
        self.cost = cost or StepCostModel()  # pure-decode steps that verified proposals
        self.plain = plain or StepCostModel()  # pure-decode steps without any
        self.acceptance = acceptance or AcceptanceModel()
        self.proposer = proposer or UnitCost()  # p: per decoding request the proposer looked at
        self.overhead = overhead or UnitCost()  # v: per granted proposal, outside the forward
        self.hit_rate = 1.0  # h: the share of looked-at requests that got a proposal (decayed)
        self.explore_every = explore_every
        self._steps_since_grant = 0
        self._exploring = False

    def worth_proposing(self, request_ids: list[str], base_tokens: int, k: int) -> bool:
        """Before the proposer runs: whether granting proposals to these decoding requests (each
        proposing up to k, at its measured rate times the hit rate) would beat a plain step, with
        the proposer's own time counted. False skips the proposer this step; every
        `explore_every` such steps one exploring step runs it (and grants one proposal each)."""
        self._exploring = False
        line = self.cost.line()
        plain = self.plain.estimate(base_tokens)
        if not request_ids or line is None or plain is None:
            return True
        rates = {rid: self.acceptance.rate(rid) * self.hit_rate for rid in request_ids}
        _, tokens, expected, num_granted = self._best(dict.fromkeys(request_ids, k), rates, base_tokens,
                                                      len(request_ids), line)
        fixed, per_token = line
        spec_cost = (fixed + per_token * tokens + self.overhead.per_unit * num_granted
                     + self.proposer.per_unit * len(request_ids))
        if num_granted and expected / spec_cost > len(request_ids) / plain:
            return True
        self._steps_since_grant += 1
        if self._steps_since_grant >= self.explore_every:
            self._steps_since_grant = 0
            self._exploring = True
            return True
        return False

    def grant(self, proposals: dict[str, int], base_tokens: int, num_decodes: int) -> Grant:
        """How many of its `proposals[rid]` proposals each request verifies.

        `base_tokens`: the step's query tokens without any proposal; `num_decodes`: the requests
        that emit a token this step whatever the grant (each counts one expected token)."""
        wanted = {rid: k for rid, k in proposals.items() if k > 0}
        if not wanted:
            return Grant({}, "no proposals")
        if self._exploring:
            self._exploring = False
            return Grant(dict.fromkeys(wanted, 1), "exploring")
        line = self.cost.line()
        if line is None:
            self._steps_since_grant = 0
            return Grant(dict(wanted), "learning the step cost: full proposals")
        rates = {rid: self.acceptance.rate(rid) for rid in wanted}
        granted, tokens, expected, num_granted = self._best(wanted, rates, base_tokens, num_decodes, line)
        if granted:
            fixed, per_token = line
            plain = self.plain.estimate(base_tokens)
            spec_rate = expected / (fixed + per_token * tokens + self.overhead.per_unit * num_granted)
            if plain is None or spec_rate > max(num_decodes, 1) / plain:
                self._steps_since_grant = 0
                return Grant(granted, "measured cost")
            reason = "a plain step is faster"
        else:
            reason = "verification costs more than it saves"
        self._steps_since_grant += 1
        if self._steps_since_grant >= self.explore_every:
            self._steps_since_grant = 0
            return Grant(dict.fromkeys(wanted, 1), "exploring")
        return Grant({}, reason)

    def _best(self, wanted: dict[str, int], rates: dict[str, float], base_tokens: int, num_decodes: int,
              line: tuple[float, float]) -> tuple[dict[str, int], int, float, int]:
        """Proposals best gain first while the rate still rises; each costs b + v at the margin.
        Returns (grant, the step's tokens, expected emitted tokens, proposals granted)."""
        fixed, per_token = line
        marginal = per_token + self.overhead.per_unit
        tokens, num_granted = base_tokens, 0
        expected = float(max(num_decodes, 1))
        granted = dict.fromkeys(wanted, 0)
        heap = [(-rates[rid], rid) for rid in wanted]
        heapq.heapify(heap)
        while heap:
            neg_gain, rid = heap[0]
            gain = -neg_gain
            cost_now = fixed + per_token * tokens + self.overhead.per_unit * num_granted
            if gain * cost_now <= expected * marginal:
                break  # this proposal, the best left, would lower the rate; the rest gain less
            heapq.heappop(heap)
            granted[rid] += 1
            tokens += 1
            num_granted += 1
            expected += gain
            if granted[rid] < wanted[rid]:
                heapq.heappush(heap, (-gain * rates[rid], rid))
        return {rid: k for rid, k in granted.items() if k}, tokens, expected, num_granted

    def observe_step(self, num_tokens: int, seconds: float, num_spec_tokens: int = 1) -> None:
        """A pure-decode step's query tokens and its forward + plain sampling time."""
        (self.cost if num_spec_tokens else self.plain).observe(num_tokens, seconds)

    def observe_proposer(self, seconds: float, num_requests: int, num_with_proposals: int) -> None:
        self.proposer.observe(seconds, num_requests)
        if num_requests:
            self.hit_rate = 0.95 * self.hit_rate + 0.05 * num_with_proposals / num_requests

    def observe_overhead(self, seconds: float, num_spec_tokens: int) -> None:
        self.overhead.observe(seconds, num_spec_tokens)

    def observe_draft(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        self.acceptance.observe(request_id, num_drafts, num_accepted)
