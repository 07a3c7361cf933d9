"""Turns "a prompt of N tokens" into text, exactly when a tokenizer is at hand.

Prompts are random words rather than random token ids: words survive any
tokenizer and any endpoint (chat or completions), and random order keeps
different prompts from sharing a cached prefix by accident.

With a token counter (the server's POST /tokenize, or later a local tokenizer)
we calibrate once which words cost exactly one token after a space, then build
each prompt and correct it word by word until the count is exact. Without one,
we assume one token per word, which common short English words roughly are.
"""
from __future__ import annotations

import asyncio
from typing import Protocol

import numpy as np

# Short, frequent English words: one token each in the common BPE/SentencePiece
# vocabularies, which keeps the word-count estimate honest without a tokenizer.
WORDS: tuple[str, ...] = tuple(dict.fromkeys(
    """the of and to in is was for on are as with his they at be this from have or
    by one had not but what all were when we there can an your which their said if
    do will each about how up out them then she many some so these would other into
    has more her two like him see time could no make than first been its who now
    people my made over did down only way find use may water long little very after
    words called just where most know get through back much go good new write our
    me man too any day same right look think also around another came come work
    three word must because does part even place well such here take why things
    help put years different away again off went old number great tell men say
    small every found still between name should home big give air line set own
    under read last never us left end along while might next sound below saw
    something thought both few those always looked show large often together asked
    house world going want school important until form food keep children feet
    land side without boy once animals life enough took sometimes four head above
    kind began almost live page got earth need far hand high year mother light
    parts country father let night following picture being study second eyes soon
    times story boys since white days ever paper hard near sentence better best
    across during today others sure means knew its try told young miles sun ways
    thing whole hear example heard several change answer room sea against top
    turned learn point city play toward five using himself usually""".split()
))


class TokenCounter(Protocol):
    """Counts prompt tokens the way the target will (template and BOS included)."""

    async def count(self, text: str) -> int: ...


class PromptBuilder(Protocol):
    exact: bool

    async def build(
        self, rng: np.random.Generator, target: int, prefix: str = "", prefix_len: int = 0
    ) -> tuple[str, int]:
        """Text of about `target` tokens in total, starting with `prefix`
        (itself `prefix_len` tokens); returns (text, token count)."""
        ...


def _join(prefix: str, words: list[str]) -> str:
    if not prefix:
        return " ".join(words)
    sep = "" if prefix[-1].isspace() else " "
    return prefix + (sep + " ".join(words) if words else "")


class WordPromptBuilder:
    """No tokenizer: one word per token, counts are estimates."""

    exact = False

    def __init__(self, words: tuple[str, ...] = WORDS) -> None:
        self.words = words

    async def build(
        self, rng: np.random.Generator, target: int, prefix: str = "", prefix_len: int = 0
    ) -> tuple[str, int]:
        n = max(target - prefix_len, 0 if prefix else 1)
        picks = rng.integers(0, len(self.words), size=n)
        return _join(prefix, [self.words[i] for i in picks]), prefix_len + n


class ExactPromptBuilder:
    """Hits the requested token count by asking a `TokenCounter`.

    Needs `calibrate()` first: it keeps only words that add exactly one token
    after a space, so each correction step moves the count by one."""

    exact = True
    max_rounds = 8  # corrections per prompt; one or two are usual

    def __init__(self, counter: TokenCounter, words: tuple[str, ...] = WORDS) -> None:
        self.counter = counter
        self.words: tuple[str, ...] = words
        self.overhead = 0  # tokens the counter adds on its own (BOS, chat template)

    async def calibrate(self, concurrency: int = 16) -> None:
        sem = asyncio.Semaphore(concurrency)

        async def cost(word: str) -> int:
            async with sem:
                return await self.counter.count("the " + word)

        base = await self.counter.count("the")
        costs = await asyncio.gather(*(cost(w) for w in self.words))
        single = tuple(w for w, c in zip(self.words, costs) if c - base == 1)
        if len(single) < 16:
            raise RuntimeError(
                f"tokenizer calibration found only {len(single)} one-token words; "
                "use --no-tokenize to fall back to word-count estimates"
            )
        self.words = single
        self.overhead = max(base - 1, 0)

    async def build(
        self, rng: np.random.Generator, target: int, prefix: str = "", prefix_len: int = 0
    ) -> tuple[str, int]:
        used = prefix_len if prefix else self.overhead
        words = [self.words[i] for i in rng.integers(0, len(self.words), size=max(target - used, 1))]
        text = _join(prefix, words)
        count = await self.counter.count(text)
        for _ in range(self.max_rounds):
            diff = target - count
            if diff == 0:
                break
            if diff > 0:
                words += [self.words[i] for i in rng.integers(0, len(self.words), size=diff)]
            else:
                keep = len(words) + diff
                if keep < (0 if prefix else 1):
                    break  # target is below the fixed overhead: cannot shrink further
                del words[keep:]
            text = _join(prefix, words)
            count = await self.counter.count(text)
        return text, count
