"""The two records every part of the benchmark passes around.

`BenchRequest` is what a dataset produces: prompt text plus the output length we
ask for. It holds no HTTP details on purpose, so the same list can later be fed
to offline baselines (transformers, `LLM.generate`) for a side-by-side compare.
`RequestRecord` is what the HTTP client measured for one request.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class BenchRequest:
    index: int  # position in the dataset; records point back to it
    prompt: str
    prompt_len: int  # tokens, exact when a tokenizer was available, else estimated
    expected_output_len: int  # sent as max_tokens
    prefix_id: int | None = None  # shared-prefix dataset: which system prompt
    exact_len: bool = False  # True when prompt_len was counted by a real tokenizer


@dataclass(slots=True)
class RequestRecord:
    """Client-side measurements of one request; times in seconds."""

    index: int
    success: bool = False
    error: str = ""
    prompt_tokens: int = 0  # from the usage chunk, else the dataset's estimate
    output_tokens: int = 0  # from the usage chunk, else the number of content chunks
    usage_reported: bool = False
    start: float = 0.0  # send time, relative to the benchmark start
    ttft: float = 0.0  # until the first chunk carrying content
    itl: list[float] = field(default_factory=list)  # gaps between content chunks
    e2el: float = 0.0  # until the stream ended ([DONE] or EOF)
    output_chars: int = 0

    def tpot(self) -> float | None:
        """vLLM's TPOT: decode time spread over the tokens after the first.

        Undefined for a single output token (there is no decode phase)."""
        if not self.success or self.output_tokens <= 1:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)

    def chunk_times(self) -> list[float]:
        """Arrival times of the content chunks, relative to the benchmark start."""
        if not self.success:
            return []
        times = [self.start + self.ttft]
        for gap in self.itl:
            times.append(times[-1] + gap)
        return times
