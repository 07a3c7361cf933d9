"""Prompt lookup (vLLM's `ngram` method): guess the next tokens by finding the request's
latest n tokens earlier in its own prompt + output and proposing what followed them there.

Pays where the output copies its input (RAG answers, edits, quoting summaries, repeated
JSON keys) and costs only a scan of the token history when it does not.
"""
from __future__ import annotations

import numpy as np


def propose_ngram(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the longest suffix
    n-gram (min_n <= n <= max_n) of `tokens`; [] when no suffix of min_n tokens recurs.

    Longest first: a longer match is better evidence of a copy. Among occurrences of that
    n-gram, the most recent one that is followed by k tokens: it reflects the text the output
    is copying now, and a hit right behind the suffix would leave too little to propose."""
    total = len(tokens)
    if k <= 0 or total < min_n + 1:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n:]
        # Windows starting at 0 .. total-n-1: every n-gram but the suffix itself.
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:total - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            # The latest occurrence with k tokens after it; else the earliest (the most after it).
            full = hits[hits + n + k <= total]
            start = int(full[-1] if full.size else hits[0]) + n
            return tokens[start:start + k].tolist()
    return []


# Realigning on a predicted output after the reply left it: the longest of the reply's last tokens
# (at most this many, at least two: one token recurs everywhere) found in the prediction.
_REALIGN_MAX_N, _REALIGN_MIN_N = 8, 2


def propose_from_prediction(prediction: np.ndarray, output: np.ndarray, k: int) -> list[int]:
    """Up to k tokens of a predicted output (OpenAI's `prediction`) that should come next.

    While the reply follows the prediction, what follows in it. Once the reply departs from it (an
    edit), the place in the prediction where the reply's latest tokens recur, nearest to where the
    reply would be had it kept to the prediction (edits seldom move text far), and what follows
    there; [] when they do not recur."""
    done = len(output)
    if k <= 0:
        return []
    if done <= len(prediction) and np.array_equal(prediction[:done], output):
        return prediction[done:done + k].tolist()
    for n in range(min(_REALIGN_MAX_N, done, len(prediction) - 1), _REALIGN_MIN_N - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(prediction[:-1], n)  # each followed by a token
        hits = np.flatnonzero((windows == output[done - n:]).all(axis=1))
        if hits.size:
            start = int(hits[np.argmin(np.abs(hits - (done - n)))]) + n
            return prediction[start:start + k].tolist()
    return []


class NgramProposer:
    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n

    def sync(self, running) -> None:
        """Nothing to keep between steps: each lookup scans the request's tokens afresh."""

    def propose(self, req, k: int) -> list[int]:
        return propose_ngram(np.asarray(req.all_token_ids, dtype=np.int64), self.min_n, self.max_n, k)
