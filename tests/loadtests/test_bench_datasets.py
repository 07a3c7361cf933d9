"""Dataset length distributions, structure and determinism.

A local counter with the same uneven rules as the fake server stands in for
/tokenize, so exactness is checked without any network."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from kvserve.loadtests.bench.datasets import (
    LognormalDataset, RandomDataset, SharedPrefixDataset, lognormal_lengths, uniform_lengths,
)
from kvserve.loadtests.bench.prompt_builder import WORDS, ExactPromptBuilder, WordPromptBuilder

from fake_openai_server import count_tokens


class LocalCounter:
    def __init__(self) -> None:
        self.calls = 0

    async def count(self, text: str) -> int:
        self.calls += 1
        return count_tokens(text)


def exact_builder() -> ExactPromptBuilder:
    b = ExactPromptBuilder(LocalCounter())
    asyncio.run(b.calibrate())
    return b


def test_calibration_keeps_only_one_token_words():
    b = exact_builder()
    assert all(len(w) < 7 for w in b.words)  # the counter charges 2 for 7+ letters
    assert len(b.words) < len(WORDS) and b.overhead == 1  # BOS


def test_lognormal_lengths_have_median_and_cap():
    lens = lognormal_lengths(np.random.default_rng(0), 20_000, median=100, max_len=1500, sigma=1.0)
    assert np.median(lens) == pytest.approx(100, rel=0.05)
    assert lens.max() <= 1500 and lens.min() >= 1
    assert (lens == 1500).any()  # sigma=1 has a tail that reaches the cap
    assert np.percentile(lens, 99) > 5 * np.median(lens)  # long-tailed, not uniform
    with pytest.raises(ValueError):
        lognormal_lengths(np.random.default_rng(0), 3, median=100, max_len=50, sigma=1.0)


def test_uniform_lengths_respect_range_ratio():
    lens = uniform_lengths(np.random.default_rng(0), 5000, 100, 0.25)
    assert lens.min() >= 75 and lens.max() <= 125
    assert lens.min() <= 77 and lens.max() >= 123  # covers the whole range
    assert (uniform_lengths(np.random.default_rng(0), 10, 64, 0.0) == 64).all()
    with pytest.raises(ValueError):
        uniform_lengths(np.random.default_rng(0), 1, 10, 1.0)


def test_random_dataset_hits_exact_token_counts():
    ds = RandomDataset(num_prompts=12, input_len=50, output_len=20, range_ratio=0.5, seed=3)
    reqs = asyncio.run(ds.sample(exact_builder()))
    ins, outs = ds.lengths()
    assert [r.prompt_len for r in reqs] == list(ins)
    assert all(count_tokens(r.prompt) == r.prompt_len for r in reqs)  # truly exact
    assert [r.expected_output_len for r in reqs] == list(outs)
    assert [r.index for r in reqs] == list(range(12))
    assert len({r.prompt.split()[0] + r.prompt.split()[1] for r in reqs}) > 8  # no shared openings


def test_datasets_are_deterministic_under_seed():
    def prompts(seed: int) -> list[str]:
        ds = LognormalDataset(num_prompts=6, input_len=20, output_median=30, output_max=200, seed=seed)
        return [r.prompt for r in asyncio.run(ds.sample(WordPromptBuilder()))]

    assert prompts(1) == prompts(1)
    assert prompts(1) != prompts(2)


def test_lognormal_dataset_output_lengths():
    ds = LognormalDataset(num_prompts=4000, input_len=8, output_median=64, output_max=512, sigma=0.8, seed=0)
    _, outs = ds.lengths()
    assert np.median(outs) == pytest.approx(64, rel=0.06) and outs.max() <= 512


def test_shared_prefix_structure():
    ds = SharedPrefixDataset(num_prefixes=3, questions_per_prefix=4, prefix_len=40, question_len=12,
                             output_len=9, seed=5)
    reqs = asyncio.run(ds.sample(exact_builder()))
    assert len(reqs) == 12 == ds.num_prompts
    groups: dict[int, list] = {}
    for r in reqs:
        groups.setdefault(r.prefix_id, []).append(r)
    assert sorted(groups) == [0, 1, 2] and all(len(g) == 4 for g in groups.values())
    prefixes = {}
    for pid, group in groups.items():
        head = group[0].prompt.split("\n\n")[0]
        prefixes[pid] = head
        assert count_tokens(head) == 40  # prefix length in tokens (BOS included)
        assert all(r.prompt.startswith(head + "\n\n") for r in group)
        assert len({r.prompt for r in group}) == 4  # distinct questions
    assert len(set(prefixes.values())) == 3
    assert all(r.prompt_len == 52 == count_tokens(r.prompt) for r in reqs)  # prefix + question
    assert all(r.expected_output_len == 9 for r in reqs)
    assert [r.prefix_id for r in reqs] != sorted(r.prefix_id for r in reqs)  # groups interleave
