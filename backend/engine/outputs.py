"""What the engine hands back: vLLM-shaped RequestOutput / CompletionOutput."""
from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.seam.error_wire import ErrorKind


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    rank: int | None = None  # the token's rank in its vocabulary row (1: the best); prompt logprobs only


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprob] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    """Timings of a finished request (time.time() seconds), for metrics and trace spans."""
    arrival: float
    first_scheduled: float | None
    first_token: float | None
    finished: float
    preemptions: list[float]
    num_prompt_tokens: int
    num_generated_tokens: int
    finish_reasons: list[str]
    traceparent: str | None = None
    n: int = 1
    max_tokens: int | None = None
    max_choice_tokens: int = 0  # the longest choice's tokens (num_generated_tokens counts every choice)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """The engine's gauges and running totals at one moment (LLMEngine.stats())."""
    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage_perc: float
    num_free_blocks: int
    num_usable_blocks: int
    num_preemptions_total: int
    prefix_cache_queries_total: int
    prefix_cache_hits_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    num_grammar_matchers: int
    # KV blocks handed out at least once, in bytes of this process's cache (BlockPool.num_touched_blocks):
    # on the CPU, an upper bound of how much of the cache is resident.
    kv_cache_touched_bytes: int = 0
    # Speculative decoding totals (all 0 without --speculative-config): spec_decode.SpecDecodeCounters.
    spec_decode_num_drafts_total: int = 0
    spec_decode_num_draft_tokens_total: int = 0
    spec_decode_num_accepted_tokens_total: int = 0
    spec_decode_proposer_errors_total: int = 0
    spec_decode_accepted_per_position_total: tuple[int, ...] = ()  # index j: proposal j + 1 accepted
    # Gaps between consecutive tokens of a sequence (seconds) since the previous
    # stats(): each gap is in exactly one EngineStats.
    inter_token_gaps: tuple[float, ...] = ()
    # Tokens each engine step ran (prompt chunks, decode and speculative tokens) since the previous stats().
    iteration_tokens: tuple[int, ...] = ()
    # LoRA (vLLM's vllm:lora_requests_info): the adapters with running / waiting requests now, and
    # per adapter name the requests that ended (finished, aborted or failed) since the start.
    lora_running: tuple[str, ...] = ()
    lora_waiting: tuple[str, ...] = ()
    lora_requests_finished_total: tuple[tuple[str, int], ...] = ()


@dataclass(slots=True)
class RequestOutput:
    """Cumulative for LLM.generate; as a stream update, `outputs` carry only the new delta."""
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    prompt: str | None = None
    error: str | None = None
    error_kind: ErrorKind | None = None  # set with `error`
    error_param: str | None = None  # the field at fault, for ErrorKind.INVALID
    metrics: RequestMetrics | None = None  # set on the final output only
    # With prompt_logprobs: per prompt token its logprob given those before (None for the first),
    # on one output only (the first after the prompt has run), as vLLM's RequestOutput has them.
    prompt_logprobs: list[TokenLogprob | None] | None = None
