"""`--compare`: the baselines, and the seam offline baselines plug into.

Baselines run on the exact prompts of one workload and are reported as ratios
(DESIGN.md: "benchmarks are ratios measured side by side in one run"):

  (a) hf-serial        transformers generate(), one request at a time
  (b) hf-static        transformers generate(), static batches of B
  (c) kvserve-offline  kvserve LLM.generate on every prompt at once
  (d) kvserve-serve    kvserve serve over HTTP, the streaming bench client

`compare_run.py` runs them; this module names them and keeps the small
generic seam (`run_offline` over any callable) that simpler offline
comparisons and tests use. A baseline is a callable over the whole prompt list,
because batching is the very thing the baselines differ in.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from kvserve.loadtests.bench.bench_request import BenchRequest
from kvserve.loadtests.bench.datasets import Dataset
from kvserve.loadtests.bench.prompt_builder import ExactPromptBuilder, PromptBuilder, TokenCounter, WordPromptBuilder

# key -> (name, what it is); the keys are what `--compare-baselines` takes.
BASELINES: dict[str, tuple[str, str]] = {
    "a": ("hf-serial", "transformers generate(), one request at a time"),
    "b": ("hf-static", "transformers generate(), static batches"),
    "c": ("kvserve-offline", "kvserve LLM.generate, all prompts at once"),
    "d": ("kvserve-serve", "kvserve serve over HTTP, streaming client"),
}
# Output-token throughput ratios the comparison reports, numerator first.
RATIOS: tuple[tuple[str, str], ...] = (("d", "a"), ("d", "b"), ("d", "c"), ("c", "a"), ("c", "b"), ("b", "a"))


class CompareUnavailable(RuntimeError):
    """A baseline cannot run here (a dependency or the server is missing)."""


@dataclass(slots=True)
class GenerationOutput:
    index: int  # BenchRequest.index it answers
    output_tokens: int
    text: str = ""


# Takes every request (text + expected output length), returns one output each.
GenerateFn = Callable[[Sequence[BenchRequest]], Sequence[GenerationOutput]]


@dataclass(slots=True)
class OfflineResult:
    label: str
    num_requests: int
    duration: float
    total_prompt_tokens: int
    total_output_tokens: int

    @property
    def request_throughput(self) -> float:
        return self.num_requests / self.duration if self.duration > 0 else 0.0

    @property
    def output_throughput(self) -> float:
        return self.total_output_tokens / self.duration if self.duration > 0 else 0.0


def build_requests(dataset: Dataset, counter: TokenCounter | None = None) -> list[BenchRequest]:
    """The prompt list without any server, for offline baselines: exact lengths
    through a local counter (e.g. an HF tokenizer behind `async count`), else
    word estimates. Same dataset and seed give the same texts as a served run
    whose counter tokenizes identically."""

    async def go() -> list[BenchRequest]:
        builder: PromptBuilder = WordPromptBuilder()
        if counter is not None:
            exact = ExactPromptBuilder(counter)
            await exact.calibrate()
            builder = exact
        return await dataset.sample(builder)

    return asyncio.run(go())


def run_offline(label: str, requests: Sequence[BenchRequest], generate: GenerateFn) -> OfflineResult:
    started = time.perf_counter()
    outputs = list(generate(requests))
    duration = time.perf_counter() - started
    if sorted(o.index for o in outputs) != sorted(r.index for r in requests):
        raise ValueError(f"baseline {label!r} must return exactly one output per request")
    return OfflineResult(
        label=label,
        num_requests=len(requests),
        duration=duration,
        total_prompt_tokens=sum(r.prompt_len for r in requests),
        total_output_tokens=sum(o.output_tokens for o in outputs),
    )


def run_comparison(requests: Sequence[BenchRequest], baselines: Mapping[str, GenerateFn]) -> list[OfflineResult]:
    """Runs each baseline in turn on the same list, in the mapping's order."""
    return [run_offline(label, requests, fn) for label, fn in baselines.items()]


def format_comparison(results: Sequence[OfflineResult], reference: str | None = None) -> str:
    """Output-token throughput of each run relative to `reference` (default: the first)."""
    if not results:
        return "(no baselines ran)"
    ref = next((r for r in results if r.label == reference), results[0])
    lines = [f"{'baseline':<22}{'req/s':>10}{'out tok/s':>12}{'vs ' + ref.label:>20}"]
    for r in results:
        ratio = r.output_throughput / ref.output_throughput if ref.output_throughput > 0 else float("nan")
        lines.append(f"{r.label:<22}{r.request_throughput:>10.2f}{r.output_throughput:>12.1f}{ratio:>19.2f}x")
    return "\n".join(lines)


def resolve_baselines(names: str | Sequence[str]) -> list[str]:
    """`"a,b,c,d"` (or the long names, or a list of either) -> keys in a,b,c,d order.
    Empty means all of them."""
    items = names.split(",") if isinstance(names, str) else [p for n in names for p in n.split(",")]
    by_name = {name: key for key, (name, _) in BASELINES.items()} | {"hf-static-batch": "b"}
    keys: set[str] = set()
    for item in (i.strip("() ").lower() for i in items):
        if not item:
            continue
        key = item if item in BASELINES else by_name.get(item)
        if key is None:
            choices = ", ".join(f"{k} ({n})" for k, (n, _) in BASELINES.items())
            raise ValueError(f"--compare-baselines: unknown baseline {item!r}; choose from {choices}")
        keys.add(key)
    return sorted(keys) if keys else list(BASELINES)
