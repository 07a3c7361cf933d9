"""Sampler: greedy, filters, penalties, seeds independent of the batch, logprobs."""
from __future__ import annotations

import math

import pytest
import torch

from kvserve.backend.engine.sampler import NO_TOKEN, Sampler, SamplingRow
from kvserve.backend.engine.sampling_params import SamplingParams


def _row(prompt=(1,), out=(), seed=None, **kw) -> SamplingRow:
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return SamplingRow(SamplingParams(**kw), list(prompt), list(out), gen, frozenset({0}))


def _logits(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_greedy_takes_the_argmax():
    got = Sampler()(_logits([0.1, 3.0, 0.2], [5.0, 1.0, 0.0]), [_row(temperature=0), _row(temperature=0)])
    assert [t.token_id for t in got] == [1, 0]


def test_top_k_one_and_tiny_top_p_are_greedy_even_when_sampling():
    logits = _logits([0.0, 2.0, 1.9, 1.8])
    for kw in ({"top_k": 1}, {"top_p": 0.01}):
        ids = {Sampler()(logits.clone(), [_row(temperature=1.0, **kw)])[0].token_id for _ in range(30)}
        assert ids == {1}


def test_min_p_removes_unlikely_tokens():
    logits = _logits([math.log(0.6), math.log(0.3), math.log(0.1)])
    ids = {Sampler()(logits.clone(), [_row(temperature=1.0, min_p=0.4)])[0].token_id for _ in range(200)}
    assert ids == {0, 1}


def test_same_seed_same_tokens_whatever_the_batch():
    logits = torch.randn(1, 50)
    alone = [Sampler()(logits, [r])[0].token_id for r in [_row(seed=7, temperature=1.0)] * 1]
    row = _row(seed=7, temperature=1.0)
    seq_alone = [Sampler()(logits, [row])[0].token_id for _ in range(10)]
    row2 = _row(seed=7, temperature=1.0)
    batch_logits = torch.cat([torch.randn(3, 50), logits])
    seq_batched = []
    for _ in range(10):
        others = [_row(temperature=1.0), _row(seed=3, temperature=1.0), _row(temperature=0)]
        seq_batched.append(Sampler()(batch_logits, others + [row2])[3].token_id)
    assert seq_alone == seq_batched and alone[0] == seq_alone[0]


def test_penalties():
    logits = _logits([2.0, 1.9, -1.0])
    # repetition penalty divides a positive logit of a seen token: 2.0/1.5 < 1.9
    assert Sampler()(logits.clone(), [_row(prompt=[0], temperature=0, repetition_penalty=1.5)])[0].token_id == 1
    # frequency/presence penalties only count output tokens
    assert Sampler()(logits.clone(), [_row(prompt=[5], out=[0], temperature=0, presence_penalty=0.5)])[0].token_id == 1
    assert Sampler()(logits.clone(), [_row(prompt=[0], temperature=0, presence_penalty=0.5)])[0].token_id == 0
    assert Sampler()(logits.clone(), [_row(out=[0, 0], temperature=0, frequency_penalty=0.06)])[0].token_id == 1


def test_logit_bias_and_min_tokens_ban_eos():
    logits = _logits([5.0, 1.0, 0.0])
    assert Sampler()(logits.clone(), [_row(temperature=0, logit_bias={2: 10.0})])[0].token_id == 2
    # token 0 is EOS: banned while fewer than min_tokens outputs exist
    assert Sampler()(logits.clone(), [_row(temperature=0, min_tokens=2, max_tokens=5)])[0].token_id == 1
    assert Sampler()(logits.clone(), [_row(out=[1, 1], temperature=0, min_tokens=2, max_tokens=5)])[0].token_id == 0


def test_logprobs_are_from_the_raw_distribution():
    logits = _logits([1.0, 2.0, 3.0])
    tok = Sampler()(logits.clone(), [_row(temperature=0, logprobs=2, repetition_penalty=1.9, prompt=[2])])[0]
    expected = torch.log_softmax(logits[0], -1)
    assert tok.token_id == 1
    assert tok.logprob == pytest.approx(float(expected[1]))
    assert [t for t, _ in tok.top_logprobs] == [2, 1]
    assert tok.top_logprobs[0][1] == pytest.approx(float(expected[2]))


def test_bad_params_name_the_field():
    for kw, field in [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": -5}, "top_k"),
                      ({"n": 0}, "n"), ({"max_tokens": 0}, "max_tokens"), ({"temperature": float("nan")},
                                                                           "temperature"),
                      ({"stop": ["x"] * 1000}, "stop"), ({"logprobs": 99}, "logprobs")]:
        with pytest.raises(ValueError, match=f"^{field}:"):
            SamplingParams(**kw)
    # JSON allows integers of any size: beyond a float's range or an int64's they are still the field's fault
    for kw, field in [({"temperature": 10**400}, "temperature"), ({"top_p": -10**400}, "top_p"),
                      ({"logit_bias": {5: 10**400}}, "logit_bias"), ({"timeout": 10**400}, "timeout"),
                      ({"seed": 2**70}, "seed"), ({"seed": -2**70}, "seed"), ({"seed": 2**63}, "seed")]:
        with pytest.raises(ValueError, match=f"^{field}:"):
            SamplingParams(**kw)
    assert SamplingParams(seed=2**63 - 1).seed == 2**63 - 1 and SamplingParams(seed=-2**63).seed == -2**63
    # Named by the field it is in, not by itself: a message quotes nothing of the request.
    with pytest.raises(ValueError, match="^sampling_parameters: has an unknown field$"):
        SamplingParams.from_dict({"bogus": 1})


@pytest.fixture(params=["native", "torch"])
def draw_path(request, monkeypatch):
    """Both draws: the native CPU kernel (where it builds) and the torch CDF search (GPU, no compiler)."""
    if request.param == "torch":
        monkeypatch.setattr("kvserve.kernels.cpu_native.sample_rows", lambda *a: None)
    return request.param


def test_draws_follow_the_distribution_and_never_pick_a_filtered_token(draw_path):
    # top_k=3 drops the 0.05 token; the rest renormalise to 0.5/0.95, 0.3/0.95, 0.15/0.95.
    n = 6000
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(n, 1)
    rows = [_row(temperature=1.0, top_k=3, seed=(i if i % 2 else None)) for i in range(n)]
    counts = torch.bincount(torch.tensor([t.token_id for t in Sampler()(logits, rows)]), minlength=4)
    assert counts[3] == 0
    for token, p in enumerate([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95]):
        sigma = math.sqrt(n * p * (1 - p))
        assert abs(int(counts[token]) - n * p) < 4 * sigma, (token, counts.tolist())


def test_a_token_with_no_mass_is_never_drawn_even_at_the_top_of_the_cdf(draw_path):
    # The last tokens are filtered out: a uniform near 1 must not run past the last one with mass.
    logits = _logits([0.0, 0.0, float("-inf"), float("-inf")])
    assert {Sampler()(logits.clone(), [_row(temperature=1.0)])[0].token_id for _ in range(300)} == {0, 1}


def test_a_constrained_row_left_without_tokens_gets_no_token_when_sampling(draw_path):
    def ban_all(logits):
        logits[0] = float("-inf")
    got = Sampler()(_logits([1.0, 2.0], [1.0, 2.0]), [_row(temperature=1.0), _row(temperature=1.0)], ban_all)
    assert got[0].token_id == NO_TOKEN and got[1].token_id in (0, 1)


def test_allowed_token_ids_leave_only_those():
    logits = _logits([5.0, 1.0, 2.0, 0.5])
    assert Sampler()(logits.clone(), [_row(temperature=0, allowed_token_ids=[1, 3])])[0].token_id == 1
    drawn = {Sampler()(logits.clone(), [_row(temperature=1.0, allowed_token_ids=[2, 3])])[0].token_id
             for _ in range(100)}
    assert drawn == {2, 3}
    # nothing allowed is left (the only allowed id is the EOS that min_tokens bans): no token, not a guess
    got = Sampler()(logits.clone(), [_row(temperature=0, allowed_token_ids=[0], min_tokens=1)])
    assert got[0].token_id == NO_TOKEN


def test_bad_words_ban_a_word_where_its_prefix_was_just_generated():
    params = SamplingParams(temperature=0, bad_words=["x"])
    params.bad_words_token_ids = [[2], [1, 3]]  # a one-token word, and a two-token one
    logits = _logits([0.0, 1.0, 5.0, 4.0])
    row = SamplingRow(params, [1], [], None, frozenset())
    assert Sampler()(logits.clone(), [row])[0].token_id == 3  # 2 is banned everywhere; 3 only after 1
    row = SamplingRow(params, [1], [0, 1], None, frozenset())
    assert Sampler()(logits.clone(), [row])[0].token_id == 1  # after 1, the word's 3 is banned too


def test_bad_words_are_tokenized_as_written_and_after_a_space():
    vocab = {"foo": [7], " foo": [8], "a b": [1, 2], " a b": [3, 4], "zz": [5, 6], " zz": [5, 6]}
    params = SamplingParams(bad_words=["foo", " a b", "zz"])
    params.tokenize_bad_words(lambda text, add_special_tokens=True: vocab[text])
    assert params.bad_words_token_ids == [[7], [8], [1, 2], [3, 4], [5, 6]]  # " zz" is the same tokens
