"""Runs the chosen compare baselines, one after another, on one prompt list.

Order: (a) and (b) share one transformers model, then it is freed; (c) builds
kvserve's `LLM` and frees it; (d) starts the server last, so no baseline runs
while another one's model still loads or holds memory. Each baseline warms up
with a tiny request before its clock starts (lazy initialisation is nobody's
steady state). With `repeat` > 1, (c) and (d) instead run in alternating pairs
with the engine and the server both up (see _alternating_pairs).
"""
from __future__ import annotations

import contextlib
import gc
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from kvserve.loadtests.compare import BASELINES, RATIOS
from kvserve.loadtests.compare.compare_prompts import CompareRequest
from kvserve.loadtests.compare.compare_result import BaselineRun, agreement
from kvserve.loadtests.bench.runner import LoadConfig


@dataclass(slots=True)
class CompareOptions:
    model_dir: str
    baselines: Sequence[str] = tuple(BASELINES)
    dtype: str = "float32"
    device: str = "auto"  # transformers and in-process kvserve; the server picks its own ("auto")
    static_batch_size: int = 16
    naive_max_requests: int = 16  # <= 0: measure every request
    max_num_seqs: int | None = None  # kvserve engine flags for (c) and (d); None: engine default
    max_num_batched_tokens: int | None = None
    stream_interval: int | None = None  # (d) only: `kvserve serve --stream-interval`; None: the default (1)
    cpu_reserved_cores: int | None = None  # (c) and (d): cores the engine leaves free; None: the default (0)
    repeat: int = 1  # (c) and (d) this many times each, alternating (see _alternating_pairs)
    base_url: str | None = None  # (d) against this server instead of starting one
    api_key: str | None = None
    load: LoadConfig = field(default_factory=LoadConfig)
    startup_timeout_s: float = 600.0
    log: Any = None  # progress stream; None means sys.stderr as it is when a line is written

    def engine_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {"dtype": self.dtype}
        if self.device != "auto":
            args["device"] = self.device
        if self.max_num_seqs is not None:
            args["max_num_seqs"] = self.max_num_seqs
        if self.max_num_batched_tokens is not None:
            args["max_num_batched_tokens"] = self.max_num_batched_tokens
        if self.cpu_reserved_cores is not None:
            args["cpu_reserved_cores"] = self.cpu_reserved_cores
        return args

    def serve_flags(self) -> list[str]:
        flags = ["--dtype", self.dtype]
        if self.max_num_seqs is not None:
            flags += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_num_batched_tokens is not None:
            flags += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.stream_interval is not None:
            flags += ["--stream-interval", str(self.stream_interval)]
        if self.cpu_reserved_cores is not None:
            flags += ["--cpu-reserved-cores", str(self.cpu_reserved_cores)]
        return flags


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _say(opts: CompareOptions, text: str) -> None:
    print(f"compare: {text}", file=opts.log or sys.stderr, flush=True)


def run_baselines(requests: Sequence[CompareRequest], opts: CompareOptions) -> list[BaselineRun]:
    runs: list[BaselineRun] = []
    wanted = [k for k in BASELINES if k in opts.baselines]
    device = resolve_device(opts.device)
    if "a" in wanted or "b" in wanted:
        from kvserve.loadtests.compare import baseline_hf

        t = time.perf_counter()
        model = baseline_hf.load_hf_model(opts.model_dir, opts.dtype, device)
        baseline_hf.warm_up(model)
        _say(opts, f"transformers model loaded on {device} in {time.perf_counter() - t:.1f}s")
        if "a" in wanted:
            n = len(requests) if opts.naive_max_requests <= 0 else min(opts.naive_max_requests, len(requests))
            _say(opts, f"(a) hf-serial: {n} of {len(requests)} requests, one at a time")
            runs.append(_timed(opts, baseline_hf.run_serial, model, requests, opts.naive_max_requests))
        if "b" in wanted:
            _say(opts, f"(b) hf-static: {len(requests)} requests in batches of {opts.static_batch_size}")
            runs.append(_timed(opts, baseline_hf.run_static, model, requests, opts.static_batch_size))
        del model
        gc.collect()
    if opts.repeat > 1 and "c" in wanted and "d" in wanted:
        runs.extend(_alternating_pairs(requests, opts))
        return runs
    if "c" in wanted:
        from kvserve.loadtests.compare import baseline_kvserve

        llm = baseline_kvserve.make_llm(opts.model_dir, opts.engine_args())
        _say(opts, f"(c) kvserve-offline: {len(requests)} requests in one LLM.generate")
        runs.append(_timed(opts, baseline_kvserve.run_offline, llm, requests))
        del llm
        gc.collect()
    if "d" in wanted:
        runs.append(_served(requests, opts))
    return runs


def _timed(opts: CompareOptions, fn: Any, *args: Any) -> BaselineRun:
    t = time.perf_counter()
    run = fn(*args)
    _say(opts, f"({run.key}) done in {time.perf_counter() - t:.1f}s")
    return run


def _served(requests: Sequence[CompareRequest], opts: CompareOptions) -> BaselineRun:
    from kvserve.loadtests.compare.baseline_kvserve import ServeProcess, run_served

    rate = opts.load.request_rate
    if opts.base_url:
        _say(opts, f"(d) kvserve-serve: {len(requests)} requests to {opts.base_url} at rate {rate}")
        return _timed(opts, run_served, opts.base_url.rstrip("/"), opts.api_key, requests, opts.load, False)
    _say(opts, "(d) kvserve-serve: starting kvserve serve")
    t = time.perf_counter()
    with ServeProcess(opts.model_dir, opts.serve_flags(), opts.startup_timeout_s) as server:
        _say(opts, f"server ready at {server.base_url} after {time.perf_counter() - t:.1f}s; "
                   f"{len(requests)} requests at rate {rate}")
        run = _timed(opts, run_served, server.base_url, opts.api_key, requests, opts.load, True)
        run.extra["stream_interval"] = opts.stream_interval or 1
        return run


def _alternating_pairs(requests: Sequence[CompareRequest], opts: CompareOptions) -> list[BaselineRun]:
    """(c) and (d) `opts.repeat` times each on one LLM and one server, the order
    alternating, so that slow drift of the machine's speed (10-20 % over minutes
    on a shared VM) cancels out in the paired ratios. The table shows the pair
    whose (d)/(c) ratio is the median; every pair is in (d)'s `repeats`."""
    from kvserve.loadtests.compare.baseline_kvserve import ServeProcess, make_llm, run_offline, run_served
    from kvserve.loadtests.compare.compare_model import prompt_vocab_size
    from kvserve.loadtests.compare.compare_prompts import relabel

    llm = make_llm(opts.model_dir, opts.engine_args())
    with contextlib.ExitStack() as stack:
        url = opts.base_url.rstrip("/") if opts.base_url else ""
        if not url:
            url = stack.enter_context(ServeProcess(opts.model_dir, opts.serve_flags(), opts.startup_timeout_s)).base_url
        vocab_size = prompt_vocab_size(opts.model_dir)
        pairs: list[dict[str, BaselineRun]] = []
        for i in range(opts.repeat):
            order = ("c", "d") if i % 2 == 0 else ("d", "c")
            _say(opts, f"pair {i + 1}/{opts.repeat}: {order[0]} then {order[1]}")
            # Both engines keep their prefix caches between pairs: each pair gets the same
            # workload under new token ids, so neither one finds an earlier pair's prompts.
            prompts = relabel(list(requests), i, vocab_size)
            pair = {}
            for key in order:
                pair[key] = _timed(opts, run_offline, llm, prompts) if key == "c" else \
                    _timed(opts, run_served, url, opts.api_key, prompts, opts.load, not opts.base_url)
            pairs.append(pair)
    del llm
    gc.collect()
    tput = [{k: run.metrics((50.0,)).output_throughput for k, run in p.items()} for p in pairs]
    ratio = [t["d"] / t["c"] for t in tput]
    median = sorted(range(len(pairs)), key=lambda i: ratio[i])[(len(pairs) - 1) // 2]
    c, d = pairs[median]["c"], pairs[median]["d"]
    # Greedy agreement with (a) and (b) needs the dataset's own prompts: pair 1 ran them.
    c.token_ids = pairs[0]["c"].token_ids
    if not opts.base_url:  # the server we started; a user's server keeps its own setting
        d.extra["stream_interval"] = opts.stream_interval or 1
    d.extra["repeats"] = [{"pair": i + 1, "first": "c" if i % 2 == 0 else "d",
                           "c_duration_s": p["c"].duration, "d_duration_s": p["d"].duration,
                           "c_output_throughput": tput[i]["c"], "d_output_throughput": tput[i]["d"],
                           "d_over_c": ratio[i]}
                          for i, p in enumerate(pairs)]
    d.extra["repeats_shown_pair"] = median + 1
    return [c, d]


def ratios(outputs: dict[str, float]) -> dict[str, float]:
    """Output-token throughput ratios, "d_over_a" etc., for the baselines that ran."""
    out = {}
    for num, den in RATIOS:
        if num in outputs and den in outputs and outputs[den] > 0:
            out[f"{num}_over_{den}"] = outputs[num] / outputs[den]
    return out


def agreements(runs: Sequence[BaselineRun]) -> dict[str, dict[str, object]]:
    """Greedy ids of (b) and (c) against (a) where both ran the same request."""
    by_key = {r.key: r for r in runs}
    ref = by_key.get("a")
    out: dict[str, dict[str, object]] = {}
    for key in ("b", "c"):
        if ref is not None and key in by_key:
            found = agreement(ref.token_ids, by_key[key].token_ids)
            if found is not None:
                out[f"{key}_vs_a"] = found
    return out
