"""BeamSearchBackend: a backend client whose requests are beam searches over another backend.

A request's `n` is the beam width, and its choices are the best `n` beams, best first, each
with its text, ids, finish reason ("stop": it ended with an end-of-sequence token; "length")
and, when asked, logprobs. As vLLM scores them, a beam's score is its summed logprob over its
length (prompt included, an ending end-of-sequence token not) raised to `length_penalty`; beams
that end are set aside and the search goes on for `max_tokens` steps with the others.

The engine sees plain one-token requests (max_tokens 1, 2n top logprobs), each beam's prompt
the request's prompt and what the beam generated so far, so the prefix cache serves all but
its last block. Leaving the search (done, failed, or the client gone) cancels the step in flight.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import AsyncIterator

from kvserve.frontend.backend_client import (BackendClient, BackendFailed, ChoiceDelta, GenerateRequest,
                                             TokenLogprob, TopLogprob)
from kvserve.seam.limits import DEFAULT_MAX_TOKENS
from kvserve.seam.tokenizer import ModelTokenizer

# What a step's request keeps of the request's sampling: the rest is beam search's own.
_PASSED_ON = ("temperature", "cache_salt", "priority", "timeout")


@dataclass(slots=True)
class _Beam:
    tokens: list[int] = field(default_factory=list)  # generated so far
    cum_logprob: float = 0.0
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per token: its logprob and the step's top
    ended: bool = False  # its last token ends the sequence


class BeamSearchBackend:
    def __init__(self, backend: BackendClient, tokenizer: ModelTokenizer, length_penalty: float) -> None:
        self.name = backend.name
        self._backend = backend
        self._tokenizer = tokenizer
        self._length_penalty = length_penalty

    async def ready(self) -> bool:
        return await self._backend.ready()

    async def metrics_text(self) -> str:
        return await self._backend.metrics_text()

    async def describe(self):
        return await self._backend.describe()

    async def close(self) -> None:
        """The wrapped backend is the gateway's: it closes it."""

    async def generate(self, request: GenerateRequest) -> AsyncIterator[ChoiceDelta]:
        s = request.sampling
        width = int(s.get("n", 1))
        prompt = (request.prompt if isinstance(request.prompt, list)
                  else await self._tokenizer.encode_async(request.prompt, add_special_tokens=True))
        # 2n candidates a beam (n of them could end); more top logprobs only when the client asks more
        step_sampling = {"n": 1, "max_tokens": 1, "logprobs": max(2 * width, int(s.get("logprobs") or 0)),
                         "ignore_eos": True, **{k: s[k] for k in _PASSED_ON if k in s}}
        stops = frozenset() if s.get("ignore_eos") else self._tokenizer.eos_token_ids
        live, ended = [_Beam()], []
        cached = 0
        for step in range(int(s.get("max_tokens") or DEFAULT_MAX_TOKENS)):
            tops = await asyncio.gather(*(
                self._top_tokens(request, f"{step}.{i}", prompt + beam.tokens, step_sampling)
                for i, beam in enumerate(live)))
            if step == 0:
                cached = tops[0][1]
            grown = []
            for beam, (top, _) in zip(live, tops):
                for alt in top[:2 * width]:
                    child = _Beam(beam.tokens + [alt.token_id], beam.cum_logprob + alt.logprob,
                                  beam.logprobs + [TokenLogprob(alt.token_id, alt.logprob, top)],
                                  ended=alt.token_id in stops)
                    (ended if child.ended else grown).append(child)
            live = sorted(grown, key=lambda b: self._score(len(prompt), b), reverse=True)[:width]
            if not live:
                break
        best = sorted(ended + live, key=lambda b: self._score(len(prompt), b), reverse=True)[:width]
        for index, beam in enumerate(best):
            yield self._choice(index, beam, len(prompt), cached, s)

    def _score(self, prompt_len: int, beam: _Beam) -> float:
        """vLLM's get_beam_search_score: the summed logprob over the sequence's length to the penalty."""
        length = prompt_len + len(beam.tokens) - (1 if beam.ended else 0)
        return beam.cum_logprob / (max(length, 1) ** self._length_penalty)

    def _choice(self, index: int, beam: _Beam, prompt_len: int, cached: int, s: dict) -> ChoiceDelta:
        keep = len(beam.tokens) - (1 if beam.ended and not s.get("include_stop_str_in_output") else 0)
        ids = beam.tokens[:keep]
        text = self._tokenizer.decode(ids, skip_special_tokens=s.get("skip_special_tokens", True))
        logprobs = None
        if s.get("logprobs") is not None:
            k = int(s["logprobs"])
            logprobs = [TokenLogprob(e.token_id, e.logprob, e.top_logprobs[:k]) for e in beam.logprobs[:keep]]
        return ChoiceDelta(index, text=text, token_ids=ids, finish_reason="stop" if beam.ended else "length",
                           prompt_tokens=prompt_len, completion_tokens=len(ids), cached_tokens=cached,
                           logprobs=logprobs)

    async def _top_tokens(self, request: GenerateRequest, tag: str, tokens: list[int],
                          sampling: dict) -> tuple[list[TopLogprob], int]:
        """One step of one beam: the engine's top tokens after `tokens`, best first, and how many
        prompt tokens it found cached."""
        step = GenerateRequest(f"{request.request_id}-beam{tag}", tokens, sampling, stream=False,
                               traceparent=request.traceparent, lora_name=request.lora_name)
        async with contextlib.aclosing(self._backend.generate(step)) as deltas:
            async for delta in deltas:
                if delta.logprobs:
                    top = sorted(delta.logprobs[0].top_logprobs, key=lambda t: t.logprob, reverse=True)
                    return top, delta.cached_tokens
        raise BackendFailed("beam search: the backend answered a step without logprobs")
