"""Per-request engine state. Owned by the engine thread; never shared across threads.

Its KV blocks are not here: the KV cache manager owns them (`KVCacheManager.block_ids`).
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from kvserve.backend.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"

    @property
    def finished(self) -> bool:
        return self.value in ("stop", "length", "abort", "error")


@dataclass(slots=True)
class RequestTimes:
    """Wall-clock marks (time.time()) for metrics and after-the-fact trace spans."""
    arrival: float = 0.0
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None
    preemptions: list[float] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    # Requests whose KV may be shared carry the same cache key (tenant salt, or a
    # per-parent key when prefix caching is off so only the n siblings share).
    cache_key: str | None = None
    # The LoRA adapter it runs with (0 / None: the base model); the scheduler bounds the distinct
    # ids running at once by max_loras.
    lora_int_id: int = 0
    lora_name: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prompt tokens found in the prefix cache at first scheduling
    num_preemptions: int = 0
    stop_reason: int | str | None = None
    # This step's speculative proposals (spec_decode/), verified with the next token; never part
    # of the request's tokens until accepted, and cleared after every step.
    spec_token_ids: list[int] = field(default_factory=list)
    times: RequestTimes = field(default_factory=RequestTimes)
    # Its prompt's logprobs are still to be computed (prompt_logprobs, one child of a group): the
    # scheduler asks the runner for the logits of its prompt rows.
    scores_prompt: bool = False
    # Reads no prefix-cache hits: its group's prompt logprobs are still to be computed. Every child
    # of the group, so none gets its first token before the one that scores the prompt.
    no_prefix_reads: bool = False

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output without building the full list."""
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        if start >= p:
            return self.output_token_ids[start - p:end - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - p]

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status.finished
