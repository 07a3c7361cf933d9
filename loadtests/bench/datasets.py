"""Synthetic workloads: `random`, `lognormal` and `shared-prefix`.

Lengths are drawn with plain numpy (unit-testable with no server); text is
produced by a `PromptBuilder`. Every draw uses its own generator seeded from
(seed, stream, index), so prompts built concurrently still come out the same
for the same `--seed`, whatever order the tokenizer calls finish in.

A dataset yields `BenchRequest`s (text + expected output length) and nothing
HTTP-specific, so offline baselines can consume the very same list.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import asdict, dataclass
from typing import Awaitable, Protocol

import numpy as np

from kvserve.loadtests.bench.bench_request import BenchRequest
from kvserve.loadtests.bench.prompt_builder import PromptBuilder

# Generator stream ids: one per kind of draw, so adding a draw never shifts another.
_LENGTHS, _WORDS, _PREFIX, _QUESTION, _ORDER = range(5)
_BUILD_CONCURRENCY = 32  # parallel /tokenize calls while building prompts


def rng_for(seed: int, stream: int, *index: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream, *index])


class Dataset(Protocol):
    name: str

    async def sample(self, builder: PromptBuilder) -> list[BenchRequest]: ...

    def describe(self) -> dict[str, object]: ...


def uniform_lengths(rng: np.random.Generator, n: int, length: int, range_ratio: float) -> np.ndarray:
    """Integers uniform in [length*(1-r), length*(1+r)], as vllm's random dataset."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    low = max(1, math.floor(length * (1 - range_ratio)))
    high = max(low, math.ceil(length * (1 + range_ratio)))
    return rng.integers(low, high + 1, size=n)


def lognormal_lengths(rng: np.random.Generator, n: int, median: int, max_len: int, sigma: float) -> np.ndarray:
    """Long-tailed lengths: lognormal with the given median, capped at max_len.

    exp(mu) is the median of a lognormal, so mu = ln(median); sigma sets the
    tail (sigma=1 puts p99 near 10x the median before the cap)."""
    if median < 1 or max_len < median:
        raise ValueError(f"lognormal needs 1 <= median <= max, got median={median} max={max_len}")
    if sigma <= 0:
        raise ValueError(f"--lognormal-sigma must be > 0, got {sigma}")
    draws = np.exp(rng.normal(math.log(median), sigma, size=n))
    return np.clip(np.rint(draws), 1, max_len).astype(np.int64)


async def _gather_limited(jobs: list[Awaitable[BenchRequest]]) -> list[BenchRequest]:
    sem = asyncio.Semaphore(_BUILD_CONCURRENCY)

    async def one(job: Awaitable[BenchRequest]) -> BenchRequest:
        async with sem:
            return await job

    return list(await asyncio.gather(*(one(j) for j in jobs)))


async def _plain_request(builder: PromptBuilder, seed: int, i: int, in_len: int, out_len: int) -> BenchRequest:
    text, count = await builder.build(rng_for(seed, _WORDS, i), int(in_len))
    return BenchRequest(i, text, count, int(out_len), exact_len=builder.exact)


class _IndependentPrompts:
    """Datasets whose prompts share nothing: one prompt per (input, output) length pair."""

    __slots__ = ()

    async def sample(self, builder: PromptBuilder) -> list[BenchRequest]:
        ins, outs = self.lengths()
        return await _gather_limited(
            [_plain_request(builder, self.seed, i, ins[i], outs[i]) for i in range(self.num_prompts)]
        )

    def describe(self) -> dict[str, object]:
        return asdict(self)


@dataclass(slots=True)
class RandomDataset(_IndependentPrompts):
    num_prompts: int = 1000
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    seed: int = 0
    name: str = "random"

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        rng = rng_for(self.seed, _LENGTHS)
        ins = uniform_lengths(rng, self.num_prompts, self.input_len, self.range_ratio)
        outs = uniform_lengths(rng, self.num_prompts, self.output_len, self.range_ratio)
        return ins, outs


@dataclass(slots=True)
class LognormalDataset(_IndependentPrompts):
    """Inputs as `random`; outputs long-tailed, the shape real chat traffic has
    and the one that exposes head-of-line blocking in static batching."""

    num_prompts: int = 1000
    input_len: int = 1024
    range_ratio: float = 0.0
    output_median: int = 128
    output_max: int = 2048
    sigma: float = 1.0
    seed: int = 0
    name: str = "lognormal"

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        rng = rng_for(self.seed, _LENGTHS)
        ins = uniform_lengths(rng, self.num_prompts, self.input_len, self.range_ratio)
        outs = lognormal_lengths(rng, self.num_prompts, self.output_median, self.output_max, self.sigma)
        return ins, outs


@dataclass(slots=True)
class SharedPrefixDataset:
    """`num_prefixes` system prompts, each followed by `questions_per_prefix`
    different questions: the workload prefix caching is built for.

    Requests are shuffled (under the seed) so groups interleave in time, as
    tenants sharing a server do; a sorted order would flatter the cache."""

    num_prefixes: int = 4
    questions_per_prefix: int = 8
    prefix_len: int = 512
    question_len: int = 64
    output_len: int = 128
    seed: int = 0
    name: str = "shared-prefix"

    @property
    def num_prompts(self) -> int:
        return self.num_prefixes * self.questions_per_prefix

    async def sample(self, builder: PromptBuilder) -> list[BenchRequest]:
        prefixes = await asyncio.gather(
            *(builder.build(rng_for(self.seed, _PREFIX, p), self.prefix_len) for p in range(self.num_prefixes))
        )
        order = rng_for(self.seed, _ORDER).permutation(self.num_prompts)

        async def one(slot: int) -> BenchRequest:
            p, q = divmod(int(order[slot]), self.questions_per_prefix)
            prefix_text, prefix_count = prefixes[p]
            text, count = await builder.build(
                rng_for(self.seed, _QUESTION, p, q),
                prefix_count + self.question_len,
                prefix=prefix_text + "\n\n",
                prefix_len=prefix_count,
            )
            return BenchRequest(slot, text, count, self.output_len, prefix_id=p, exact_len=builder.exact)

        return await _gather_limited([one(s) for s in range(self.num_prompts)])

    def describe(self) -> dict[str, object]:
        return {**asdict(self), "num_prompts": self.num_prompts}
