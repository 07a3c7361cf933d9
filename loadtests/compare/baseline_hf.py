"""Baselines (a) and (b): Hugging Face transformers `generate()`, greedy.

(a) the naive server: one request at a time, each to its own output length.
(b) static batching: groups of B in arrival order, left-padded with an
    attention mask; a group runs until its longest request is done, so the
    shorter ones keep generating tokens nobody asked for. Those are counted as
    waste, never as output.

Token times come from a `BaseStreamer`: `generate()` hands it the prompt once,
then the new token(s) of every step right after they are chosen (on CPU and
CUDA the copy to the host synchronises, so the time is when the token really
exists). The first put after the prompt is therefore the first token: its time
is TTFT (from the run start, since every request arrived then). In a static
batch every member gets that first token at the same moment, after the batch's
prefill and after all earlier batches, exactly as a client of such a server
would see it. A static batch's E2EL is when `generate()` returns: a
request-level batching server answers the whole group at once.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from kvserve.loadtests.compare.compare_extrapolate import (
    ServiceSample, fit_service_model, replay_serial, subset_indices,
)
from kvserve.loadtests.compare.compare_prompts import CompareRequest
from kvserve.loadtests.compare.compare_result import BaselineRun, TokenClock


def load_hf_model(model_dir: str, dtype: str, device: str) -> Any:
    """The model as transformers loads it, set up for fixed-length greedy runs."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).to(device).eval()
    gen = model.generation_config
    gen.eos_token_id = None  # every request runs to its own length, as the engine does with ignore_eos
    gen.pad_token_id = 0
    gen.do_sample = False
    for knob in ("temperature", "top_p", "top_k"):  # greedy: silence "flag is ignored" warnings
        setattr(gen, knob, None)
    return model


class _StepTimes:
    """A transformers streamer that only timestamps: the first put is the prompt."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _generate(model: Any, ids: Any, mask: Any, new_tokens: int, streamer: _StepTimes) -> Any:
    import torch

    with torch.inference_mode():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, streamer=streamer)


def warm_up(model: Any) -> None:
    """Tiny calls first (one alone, one padded pair), so lazy initialisation
    is not billed to the first request of either baseline."""
    import torch

    device = next(model.parameters()).device
    ids = torch.arange(1, 9, device=device).unsqueeze(0)
    _generate(model, ids, torch.ones_like(ids), 2, _StepTimes())
    pair, mask = ids.repeat(2, 1), torch.ones(2, 8, dtype=torch.long, device=device)
    mask[1, :3] = 0
    _generate(model, pair, mask, 2, _StepTimes())


def run_serial(model: Any, requests: Sequence[CompareRequest], max_requests: int) -> BaselineRun:
    """(a): measure up to `max_requests` (spread over the list), extrapolate the rest."""
    import torch

    device = next(model.parameters()).device
    picked = [requests[i] for i in subset_indices(len(requests), max_requests)]
    samples: list[ServiceSample] = []
    token_ids: dict[int, list[int]] = {}
    clock = TokenClock()
    started = clock.start
    for r in picked:
        begin = time.perf_counter()  # = when the previous request returned: the queue never idles
        ids = torch.tensor([r.prompt_ids], device=device)
        steps = _StepTimes()
        out = _generate(model, ids, torch.ones_like(ids), r.output_len, steps)
        end = time.perf_counter()
        if len(steps.times) != r.output_len:
            raise RuntimeError(f"transformers produced {len(steps.times)} tokens for request {r.index}, "
                               f"asked for {r.output_len}")
        token_ids[r.index] = out[0, r.prompt_len:].tolist()
        clock.token_times(r.index, steps.times)
        clock.finish(r.index, at=end)
        samples.append(ServiceSample(r.prompt_len, r.output_len, steps.times[0] - begin,
                                     steps.times[-1] - steps.times[0], end - steps.times[-1]))
    measured_duration = time.perf_counter() - started
    measured = [clock.record(r.index, r.prompt_len) for r in picked]
    label = "transformers generate(), one at a time"
    if len(picked) == len(requests):
        return BaselineRun("a", "hf-serial", label, measured, measured_duration, len(picked), peak_concurrency=1,
                           token_ids=token_ids)
    fit = fit_service_model(samples)
    records, duration = replay_serial(requests, fit)
    predicted = sum(fit.service(s.prompt_len, s.output_len) for s in samples)
    return BaselineRun(
        "a", "hf-serial", label, records, duration, len(picked), peak_concurrency=1, extrapolated=True,
        token_ids=token_ids,
        measured_records=measured, measured_duration=measured_duration,
        extra={"service_model": fit.to_dict(), "measured_indices": [r.index for r in picked],
               # How well the fitted model reproduces the subset it was fitted on.
               "fit_duration_error": (predicted - measured_duration) / measured_duration},
    )


def run_static(model: Any, requests: Sequence[CompareRequest], batch_size: int) -> BaselineRun:
    """(b): batches of `batch_size` in arrival order, each to its longest output."""
    import torch

    if batch_size < 1:
        raise ValueError(f"--static-batch-size must be >= 1, got {batch_size}")
    device = next(model.parameters()).device
    pad = int(model.generation_config.pad_token_id or 0)
    token_ids: dict[int, list[int]] = {}
    wasted = padded_prompt = generated = 0
    clock = TokenClock()
    started = clock.start
    for lo in range(0, len(requests), batch_size):
        batch = requests[lo:lo + batch_size]
        width = max(r.prompt_len for r in batch)
        steps_needed = max(r.output_len for r in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, r in enumerate(batch):  # left padding: every row's last prompt token lines up
            ids[row, width - r.prompt_len:] = torch.tensor(r.prompt_ids)
            mask[row, width - r.prompt_len:] = 1
        steps = _StepTimes()
        out = _generate(model, ids.to(device), mask.to(device), steps_needed, steps)
        end = time.perf_counter()
        if len(steps.times) != steps_needed:
            raise RuntimeError(f"transformers ran {len(steps.times)} steps for a batch, asked for {steps_needed}")
        for row, r in enumerate(batch):
            token_ids[r.index] = out[row, width:width + r.output_len].tolist()
            clock.token_times(r.index, steps.times[:r.output_len])
            clock.finish(r.index, at=end)
            wasted += steps_needed - r.output_len
            padded_prompt += width - r.prompt_len
        generated += steps_needed * len(batch)
    duration = time.perf_counter() - started
    records = [clock.record(r.index, r.prompt_len) for r in requests]
    return BaselineRun(
        "b", "hf-static", f"transformers static batches of {batch_size}", records, duration, len(requests),
        peak_concurrency=min(batch_size, len(requests)), token_ids=token_ids,
        extra={"batch_size": batch_size, "num_batches": -(-len(requests) // batch_size),
               "generated_tokens_incl_waste": generated, "wasted_output_tokens": wasted,
               "padded_prompt_tokens": padded_prompt},
    )
