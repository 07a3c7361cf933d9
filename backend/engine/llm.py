"""Offline API: `LLM(model=..., **engine_args).generate(prompts, SamplingParams(...))`."""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import fields
from typing import Any, Sequence

from kvserve.backend.engine.config import EngineConfig
from kvserve.backend.engine.engine import LLMEngine
from kvserve.backend.engine.outputs import CompletionOutput, RequestOutput
from kvserve.backend.engine.sampling_params import SamplingParams
from kvserve.backend.lora import LoRARequest
from kvserve.backend.models import resolve_model_arg

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str, **engine_args: Any) -> None:
        known = {f.name for f in fields(EngineConfig)}
        unknown = sorted(set(engine_args) - known)
        if unknown:
            raise TypeError(f"LLM() got unknown engine argument {unknown[0]!r}")
        # A known model's name ("SmolLM2-135M-Instruct") is fetched into the cache on first use.
        self.engine = LLMEngine(EngineConfig(model=resolve_model_arg(model), **engine_args))
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
                 priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion through the continuous-batching scheduler, outputs in order.

        `lora_request`: one adapter for every prompt, or one per prompt (None: the base model), as
        vLLM takes it; an adapter not yet registered is registered (read and checked) first.
        `priority`: one per prompt, as vLLM takes it (lower first; needs scheduling_policy="priority")."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = (list(sampling_params) if isinstance(sampling_params, (list, tuple))
                       else [sampling_params or SamplingParams()] * len(prompts))
        if len(params_list) != len(prompts):
            raise ValueError("sampling_params: need one per prompt, or a single one for all")
        loras = (list(lora_request) if isinstance(lora_request, (list, tuple)) else [lora_request] * len(prompts))
        if len(loras) != len(prompts):
            raise ValueError("lora_request: need one per prompt, or a single one for all")
        if priority is not None:
            if len(priority) != len(prompts):
                raise ValueError("priority: need one per prompt")
            params_list = [p if p.priority == level else dataclasses.replace(p, priority=level)
                           for p, level in zip(params_list, priority)]
        for lora in dict.fromkeys(x for x in loras if x is not None):
            self.engine.add_lora(lora)
        order: list[str] = []
        results: dict[str, RequestOutput] = {}
        for prompt, params, lora in zip(prompts, params_list, loras):
            rid = f"offline-{next(self._ids)}"
            self.engine.add_request(rid, prompt, params, lora_request=lora)
            order.append(rid)
            results[rid] = RequestOutput(rid, [], [CompletionOutput(i) for i in range(params.n)],
                                         prompt=prompt if isinstance(prompt, str) else None)
        while self.engine.has_unfinished():
            for out in self.engine.step():
                _accumulate(results[out.request_id], out)
        return [results[rid] for rid in order]

    def reset_prefix_cache(self) -> bool:
        """As vLLM's LLM.reset_prefix_cache: later prompts reuse nothing computed before."""
        self.engine.reset_prefix_cache()
        return True


def _accumulate(total: RequestOutput, delta: RequestOutput) -> None:
    total.prompt_token_ids = delta.prompt_token_ids
    total.num_cached_tokens = delta.num_cached_tokens
    total.finished = delta.finished
    total.error = delta.error or total.error
    total.prompt_logprobs = delta.prompt_logprobs or total.prompt_logprobs
    total.metrics = delta.metrics or total.metrics
    for d in delta.outputs:
        c = total.outputs[d.index]
        c.text += d.text
        c.token_ids.extend(d.token_ids)
        if d.logprobs is not None:
            c.logprobs = (c.logprobs or []) + d.logprobs
        if d.finish_reason is not None:
            c.finish_reason, c.stop_reason = d.finish_reason, d.stop_reason
