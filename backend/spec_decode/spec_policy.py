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
                 acceptance: AcceptanceModel | None = None) -> None:
        self.cost = cost or StepCostModel()
        self.acceptance = acceptance or AcceptanceModel()
        self.explore_every = explore_every
        self._steps_since_grant = 0

    def grant(self, proposals: dict[str, int], base_tokens: int, num_decodes: int) -> Grant:
        """How many of its `proposals[rid]` proposals each request verifies.

        `base_tokens`: the step's query tokens without any proposal; `num_decodes`: the requests
        that emit a token this step whatever the grant (each counts one expected token)."""
        wanted = {rid: k for rid, k in proposals.items() if k > 0}
        if not wanted:
            return Grant({}, "no proposals")
        line = self.cost.line()
        if line is None:
            self._steps_since_grant = 0
            return Grant(dict(wanted), "learning the step cost: full proposals")
        fixed, per_token = line
        tokens = base_tokens
        expected = float(max(num_decodes, 1))
        granted = dict.fromkeys(wanted, 0)
        rates = {rid: self.acceptance.rate(rid) for rid in wanted}
        heap = [(-rates[rid], rid) for rid in wanted]
        heapq.heapify(heap)
        while heap:
            neg_gain, rid = heap[0]
            gain = -neg_gain
            cost_now = fixed + per_token * tokens
            if gain * cost_now <= expected * per_token:
                break  # this proposal, the best left, would lower the rate; the rest gain less
            heapq.heappop(heap)
            granted[rid] += 1
            tokens += 1
            expected += gain
            if granted[rid] < wanted[rid]:
                heapq.heappush(heap, (-gain * rates[rid], rid))
        granted = {rid: k for rid, k in granted.items() if k}
        if granted:
            self._steps_since_grant = 0
            return Grant(granted, "measured cost")
        self._steps_since_grant += 1
        if self._steps_since_grant >= self.explore_every:
            self._steps_since_grant = 0
            return Grant(dict.fromkeys(wanted, 1), "exploring")
        return Grant({}, "verification costs more than it saves")

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        self.cost.observe(num_tokens, seconds)

    def observe_draft(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        self.acceptance.observe(request_id, num_drafts, num_accepted)
