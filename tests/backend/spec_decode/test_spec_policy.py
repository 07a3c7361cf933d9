"""The load policy (spec_decode/spec_policy.py) on synthetic cost models: it grants proposals
when the step is weight-bound (extra tokens nearly free) and none when it is compute-bound, it
grants more to requests whose proposals get accepted, and the engine's greedy output stays
exact with it on."""
from __future__ import annotations

import pytest

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.spec_decode.spec_policy import AcceptanceModel, LoadPolicy, StepCostModel


def _policy(fixed: float, per_token: float, rate: float, explore_every: int = 64) -> LoadPolicy:
    """A policy whose cost line was fitted on steps of `fixed + per_token * n` seconds and whose
    method accepts each next proposal with probability `rate`."""
    cost = StepCostModel()
    for n in (1, 2, 4, 8, 16, 32, 64, 1, 5, 9):
        cost.observe(n, fixed + per_token * n)
    acceptance = AcceptanceModel(prior=rate, prior_weight=1000.0)
    return LoadPolicy(explore_every=explore_every, cost=cost, acceptance=acceptance)


def test_the_cost_line_is_fitted_from_the_steps():
    cost = StepCostModel()
    assert cost.line() is None
    for n in (1, 5, 9, 1, 5, 9, 1, 5):
        cost.observe(n, 0.040 + 0.002 * n)
    fixed, per_token = cost.line()
    assert fixed == pytest.approx(0.040) and per_token == pytest.approx(0.002)
    # A steady load (every step the same size) cannot refit the line: the last one stands.
    for _ in range(300):
        cost.observe(16, 0.5)
    assert cost.line() == pytest.approx((0.040, 0.002))


def test_a_weight_bound_step_at_batch_one_gets_the_full_proposal():
    # 40 ms a step, 0.5 ms a token: verifying 8 proposals costs 10% more; at 80% acceptance even
    # the 8th (0.8^8 = 0.17 expected tokens) pays for its 0.5 ms.
    grant = _policy(0.040, 0.0005, rate=0.8).grant({"a": 8}, base_tokens=1, num_decodes=1)
    assert grant.num_tokens == {"a": 8}


def test_a_compute_bound_step_gets_none():
    # A full batch where each token costs as much as the fixed part: a proposal below certainty loses.
    grant = _policy(0.010, 0.010, rate=0.6).grant({f"r{i}": 4 for i in range(16)}, base_tokens=16, num_decodes=16)
    assert grant.num_tokens == {}
    assert "costs more" in grant.reason


def test_the_grant_shrinks_as_the_batch_grows():
    policy = _policy(0.040, 0.002, rate=0.7)
    granted = []
    for batch in (1, 4, 16, 64):
        grant = policy.grant({f"r{i}": 8 for i in range(batch)}, base_tokens=batch, num_decodes=batch)
        granted.append(sum(grant.num_tokens.values()) / batch)
    assert granted[0] > 0 and granted == sorted(granted, reverse=True) and granted[-1] < granted[0]


def test_requests_that_get_accepted_get_more():
    policy = _policy(0.040, 0.004, rate=0.5)
    for _ in range(20):
        policy.observe_draft("copying", 4, 4)
        policy.observe_draft("wandering", 4, 0)
    grant = policy.grant({"copying": 8, "wandering": 8}, base_tokens=2, num_decodes=2)
    assert grant.num_tokens.get("copying", 0) > grant.num_tokens.get("wandering", 0)


def test_it_learns_before_it_trusts_the_line_and_explores_when_idle():
    assert LoadPolicy().grant({"a": 5}, 1, 1).num_tokens == {"a": 5}  # no line yet: full proposals
    policy = _policy(0.010, 0.010, rate=0.3, explore_every=4)
    grants = [policy.grant({"a": 3, "b": 2}, 2, 2).num_tokens for _ in range(8)]
    assert grants == [{}, {}, {}, {"a": 1, "b": 1}] * 2


def test_acceptance_follows_the_method_and_each_request():
    acc = AcceptanceModel(prior=0.5, prior_weight=4.0)
    for _ in range(50):
        acc.observe("x", 4, 1)  # 1 accepted then 1 rejected: a conditional rate of 1/2
    assert acc.rate("x") == pytest.approx(0.5, abs=0.05)
    for _ in range(50):
        acc.observe("y", 4, 4)
    assert acc.rate("y") > 0.9 > acc.rate("x")
    acc.forget({"y"})
    assert acc.rate("x") == acc.method_rate


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_greedy_output_stays_exact_with_the_policy_on(llama_dir, method):
    config = {"method": method, "num_speculative_tokens": 6, "load_policy": "measured"}
    if method == "ngram":
        config.update(prompt_lookup_min=1, prompt_lookup_max=3)
    prompts = ["the cat sat on the mat. the cat sat on the mat. the cat",
               "one two three four five one two three four five one two", "a b c a b c a b"] * 3
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    base = LLM(model=llama_dir, max_model_len=256, max_num_seqs=9)
    spec = LLM(model=llama_dir, max_model_len=256, max_num_seqs=9, speculative_config=config)
    want = [o.outputs[0].token_ids for o in base.generate(prompts, params)]
    for batch in (1, 9):  # one at a time, then all at once: the policy sees both loads
        got = []
        for i in range(0, len(prompts), batch):
            got += [o.outputs[0].token_ids for o in spec.generate(prompts[i:i + batch], params)]
        assert got == want
    speculator = spec.engine.speculator
    assert speculator.policy is not None and speculator.policy.cost.line() is not None
    assert speculator.counters.num_accepted_tokens > 0 and speculator.last_grant.reason


def test_load_policy_is_checked_at_start(llama_dir):
    with pytest.raises(ValueError, match="speculative_config.load_policy"):
        LLM(model=llama_dir, max_model_len=128, speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                                                    "load_policy": "sometimes"})
    off = LLM(model=llama_dir, max_model_len=128,
              speculative_config={"method": "suffix", "load_policy": "off"})
    assert off.engine.speculator.policy is None
