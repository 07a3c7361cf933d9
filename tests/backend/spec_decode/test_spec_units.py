"""Speculative decoding's pure parts: the config check, n-gram prompt lookup, the acceptance rule."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from kvserve.backend.spec_decode import NgramProposer, parse_speculative_config, verify_proposals
from kvserve.backend.spec_decode.ngram_proposer import propose_ngram


# ---- --speculative-config -----------------------------------------------------------------
def test_config_ngram_defaults_and_json_text():
    c = parse_speculative_config({"method": "ngram", "num_speculative_tokens": 4})
    assert (c.method, c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max) == ("ngram", 4, 5, 5)
    c = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2}')
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (2, 2)
    assert parse_speculative_config(None) is None and parse_speculative_config({}) is None


@pytest.mark.parametrize("config, field", [
    ({"method": "eagle", "num_speculative_tokens": 2}, "speculative_config.method"),
    ({"method": "draft_model", "model": "/nonexistent", "num_speculative_tokens": 2}, "speculative_config.model"),
    ({"num_speculative_tokens": 2}, "speculative_config.method"),
    ({"method": "ngram"}, "speculative_config.num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 99}, "speculative_config.num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": True}, "speculative_config.num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}, "speculative_config.prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     "speculative_config.prompt_lookup_max"),
    ({"method": "ngram", "num_speculative_tokens": 2, "lookup": 3}, "speculative_config.lookup"),
    ("[1, 2]", "speculative_config"),
    ("{not json", "speculative_config"),
])
def test_config_refusals_name_the_field(config, field):
    with pytest.raises(ValueError) as err:
        parse_speculative_config(config)
    assert str(err.value).startswith(field + ":")


# ---- n-gram prompt lookup ------------------------------------------------------------------
def _propose(tokens, lo, hi, k):
    return propose_ngram(np.asarray(tokens, dtype=np.int64), lo, hi, k)


def test_ngram_proposes_what_followed_the_suffix():
    assert _propose([1, 2, 3, 4, 5, 9, 1, 2, 3], 1, 3, 2) == [4, 5]
    assert _propose([1, 2, 3, 4, 5, 9, 1, 2, 3], 1, 3, 10) == [4, 5, 9, 1, 2, 3]  # up to the end


def test_ngram_prefers_the_longest_match():
    # The 1-gram [3] last occurred before 7; the 2-gram [2, 3] before 4: the longer one wins.
    tokens = [2, 3, 4, 0, 3, 7, 0, 2, 3]
    assert _propose(tokens, 1, 2, 1) == [4]
    assert _propose(tokens, 1, 1, 1) == [7]


def test_ngram_respects_min_and_finds_nothing_new():
    assert _propose([1, 2, 3, 4], 1, 3, 3) == []  # no token recurs
    assert _propose([5, 1, 2, 6, 2], 2, 3, 3) == []  # [6, 2] never seen before; 1-grams are below min
    assert _propose([5, 1, 2, 6, 2], 1, 3, 3) == [6, 2]
    assert _propose([7], 1, 3, 3) == [] and _propose([], 1, 3, 3) == [] and _propose([1, 1], 1, 3, 0) == []


def test_ngram_takes_the_latest_occurrence_with_k_tokens_after_it():
    tokens = [1, 2, 10, 11, 1, 2, 20, 21, 1, 2]
    assert _propose(tokens, 2, 2, 2) == [20, 21]
    # A run of one token: the latest hit right behind the suffix leaves too little, so the earliest.
    assert NgramProposer(1, 1).propose(SimpleNamespace(all_token_ids=[4, 4, 4, 4, 4]), 3) == [4, 4, 4]


# ---- the acceptance rule ------------------------------------------------------------------
def _one_hot_logits(best: list[int], vocab: int = 8) -> torch.Tensor:
    logits = torch.zeros(len(best), vocab)
    logits[torch.arange(len(best)), torch.tensor(best)] = 5.0
    return logits


def test_a_prediction_is_proposed_while_the_output_follows_it_and_realigned_after_an_edit():
    from kvserve.backend.spec_decode.ngram_proposer import propose_from_prediction
    pred = np.array([10, 11, 12, 13, 14, 15, 16, 17, 18, 19])
    assert propose_from_prediction(pred, np.array([], dtype=np.int64), 3) == [10, 11, 12]
    assert propose_from_prediction(pred, np.array([10, 11]), 4) == [12, 13, 14, 15]
    assert propose_from_prediction(pred, pred, 4) == []  # all of it came: nothing left to propose
    # an edit: 12 became 99 and 98; the reply took up the prediction again at 13 14
    assert propose_from_prediction(pred, np.array([10, 11, 99, 98, 13, 14]), 3) == [15, 16, 17]
    assert propose_from_prediction(pred, np.array([10, 11, 99, 98]), 3) == []  # off it: nothing recurs
    # of two places the reply's end recurs, the one nearest to where the reply has got to
    twice = np.array([1, 2, 3, 7, 8, 1, 2, 3, 9, 9])
    assert propose_from_prediction(twice, np.array([5, 5, 5, 5, 6, 2, 3]), 2) == [9, 9]
    assert propose_from_prediction(twice, np.array([6, 2, 3]), 2) == [7, 8]


def test_greedy_accepts_the_prefix_equal_to_the_argmax_plus_one():
    logits = _one_hot_logits([3, 4, 5, 6])
    assert verify_proposals(logits, [3, 4, 5], True, None) == [3, 4, 5, 6]  # all accepted + bonus
    assert verify_proposals(logits, [3, 1, 5], True, None) == [3, 4]  # the correction ends the run
    assert verify_proposals(logits, [0, 4, 5], True, None) == [3]


def _draw_with(gen: torch.Generator):
    """A stand-in for the sampler's draw: one token from a row of logits, counted."""
    def draw(row: torch.Tensor) -> int:
        draw.calls += 1
        return int(torch.multinomial(row[0].softmax(-1), 1, generator=gen))
    draw.calls = 0
    return draw


def test_sampling_accepts_certain_drafts_and_never_emits_impossible_ones():
    logits = torch.full((3, 6), float("-inf"))
    logits[0, 2] = logits[1, 4] = 0.0  # the target puts all its mass on 2, then on 4
    logits[2, :] = 0.0
    draw = _draw_with(torch.Generator().manual_seed(0))
    for _ in range(50):
        run = verify_proposals(logits, [2, 4], False, draw)
        assert run[:2] == [2, 4] and len(run) == 3
        run = verify_proposals(logits, [2, 5], False, draw)  # 5 has no mass: always rejected for 4
        assert run == [2, 4]


def test_one_draw_per_emitted_token_as_plain_decoding_takes():
    """So a seeded request's random numbers line up with plain decoding's, token for token."""
    logits = torch.randn(5, 16, generator=torch.Generator().manual_seed(1))
    for seed in range(20):
        draw = _draw_with(torch.Generator().manual_seed(seed))
        run = verify_proposals(logits, [3, 1, 4, 1], False, draw)
        assert draw.calls == len(run) and 1 <= len(run) <= 5
    with pytest.raises(ValueError):
        verify_proposals(logits, [3], False, None)


def test_sampling_rejection_keeps_the_target_distribution():
    """Position 0 with one-hot draft 1: the emitted token's frequencies match p over 40k tries,
    and the draft is accepted (the run goes on) with probability p(1)."""
    p = torch.tensor([0.1, 0.5, 0.25, 0.15])
    logits = p.log()[None, :].repeat(2, 1)
    draw = _draw_with(torch.Generator().manual_seed(7))
    n = 40_000
    counts = torch.zeros(4)
    accepted = 0
    for _ in range(n):
        run = verify_proposals(logits, [1], False, draw)
        counts[run[0]] += 1
        accepted += len(run) == 2
    chi2 = float((((counts - n * p) ** 2) / (n * p)).sum())
    assert chi2 < 16.3  # 3 degrees of freedom, p = 0.001
    assert accepted == counts[1]


def test_seeded_verification_reproduces_itself():
    logits = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
    runs = [verify_proposals(logits, [1, 2, 3], False, _draw_with(torch.Generator().manual_seed(11)))
            for _ in range(2)]
    assert runs[0] == runs[1]
