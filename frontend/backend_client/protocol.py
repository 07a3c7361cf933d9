"""The contract between the HTTP layer and whatever runs the model.

All HTTP logic talks to a `BackendClient`; `TritonBackendClient` implements it
over KServe v2 gRPC, `ReplicaSet` balances several of them, and the tests use
an in-memory fake. Nothing here imports gRPC, so the HTTP code can be tested
without a server.

One `generate()` call is one Triton request: one prompt, `n` choices. Every
`ChoiceDelta` it yields belongs to exactly one choice (its `index` is the
choice index inside this request, 0..n-1). A choice is finished when a delta
for it carries a non-empty `finish_reason`. Closing the iterator early (break,
`aclose()`, or cancelling the task that iterates) cancels the request in the
backend at once, so the engine frees its KV blocks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Protocol, runtime_checkable

from kvserve.seam.error_wire import ErrorKind


@dataclass(slots=True, frozen=True)
class TopLogprob:
    token_id: int
    logprob: float


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """The sampled token's logprob plus the top alternatives the client asked for.
    Numbers only: the gateway renders the token strings with its tokenizer."""

    token_id: int
    logprob: float | None  # None: a prompt's first token (nothing before it to score it by)
    top_logprobs: list[TopLogprob] = field(default_factory=list)
    rank: int | None = None  # prompt logprobs: the token's vocabulary rank (1: the best)


@dataclass(slots=True)
class GenerateRequest:
    request_id: str
    prompt: str | list[int]  # text goes to `text_input`, token ids to `input_ids`
    sampling: dict[str, Any]  # SamplingParams field -> value; sent as JSON
    stream: bool = True
    traceparent: str | None = None  # W3C trace context for the backend's spans
    lora_name: str | None = None  # the LoRA adapter it runs with (the backend resolves it); None: the base model


@dataclass(slots=True)
class ChoiceDelta:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # None while running
    prompt_tokens: int = 0
    completion_tokens: int = 0  # cumulative for this choice
    cached_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None  # one entry per new token when requested
    # prompt_logprobs: one entry per prompt token (the first's logprob None), on one delta of the
    # request, before or with any choice's first token
    prompt_logprobs: list[TokenLogprob] | None = None


@dataclass(slots=True, frozen=True)
class ModelFacts:
    """What the backend says it serves (seam.tensors.MODEL_FACTS); None where it did not say."""

    max_model_len: int | None
    served_model_name: str | None
    enable_lora: bool | None = None


@dataclass(slots=True, frozen=True)
class LoRAAdapterInfo:
    """One LoRA adapter a backend serves (seam.tensors.LORA_ADAPTER_KEYS)."""

    name: str
    path: str
    parent: str | None = None  # the base model it was given for (--lora-modules base_model_name)


class BackendError(Exception):
    """Base for failures of one backend request."""


class BackendUnavailable(BackendError):
    """Transport failure or backend not ready: HTTP 503, the request may be retried."""


class ShuttingDown(BackendUnavailable):
    """The gateway's shutdown deadline passed with the request still running."""


class BackendRejected(BackendError):
    """The engine refused or ended the request (bad field, prompt too long,
    overloaded, its timeout ran out): `kind` says which, `param` names the
    field at fault (the engine's name: a SamplingParams field or the prompt)."""

    def __init__(self, message: str, *, kind: ErrorKind = ErrorKind.INVALID, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.param = param

    @property
    def overloaded(self) -> bool:
        """Another replica may take it: the engine's queue is full or it is closing."""
        return self.kind.retryable


class BackendFailed(BackendError):
    """The engine failed while running the request (finish_reason "error" or an internal error)."""


@runtime_checkable
class BackendClient(Protocol):
    name: str  # for logs and metrics labels: a URL or "fake"

    def generate(self, request: GenerateRequest) -> AsyncIterator[ChoiceDelta]:
        """Run one request; raises BackendError subclasses from the iterator."""
        ...

    async def ready(self) -> bool:
        """True when the server and the model are ready to take requests."""
        ...

    async def metrics_text(self) -> str:
        """The backend's Prometheus exposition text ("" when it has none)."""
        ...

    async def describe(self) -> ModelFacts | None:
        """The served model's context length and name, asked of the backend; None when it
        cannot tell (a model that predates the question). Raises BackendUnavailable when no
        answer came (transport failure, timeout): then it may be asked again."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class LoRAControl(Protocol):
    """A backend that manages LoRA adapters (seam.tensors.LORA_CONTROL_PARAM). Optional: a
    BackendClient without it serves no adapters. Every call answers the adapters served after
    it; BackendRejected (kind NOT_FOUND: unknown name, INVALID: bad files or name) when refused.
    A ReplicaSet applies load and unload to each replica."""

    async def lora_control(self, action: str, lora_name: str | None = None,
                           lora_path: str | None = None) -> list[LoRAAdapterInfo]: ...


@runtime_checkable
class EngineControl(Protocol):
    """A backend that acts on its engines (seam.tensors.ENGINE_CONTROL_PARAM). Optional. Answers
    {"action", "forgotten_blocks"}; a ReplicaSet acts on every replica and sums the blocks."""

    async def engine_control(self, action: str) -> dict[str, Any]: ...


@dataclass(slots=True)
class EmbedRequest:
    """One /v1/embeddings call: every input in one backend request (the model batches them)."""

    request_id: str
    inputs: list[str] | list[list[int]]  # texts go to `text_input`, token ids to `input_ids` + `input_lengths`
    pooling: dict[str, Any]  # truncate_prompt_tokens / normalize / dimensions, only those the client set
    traceparent: str | None = None


@dataclass(slots=True, frozen=True)
class EmbedResult:
    vectors: list[bytes]  # one little-endian float32 vector per input, as the backend sent them
    prompt_tokens: list[int]


@runtime_checkable
class EmbeddingBackend(Protocol):
    """The embedding model's backend. `embed()` is one request and one answer;
    cancelling the awaiting task cancels the backend request."""

    name: str

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """Raises BackendError subclasses, as generate() does."""
        ...

    async def ready(self) -> bool: ...

    async def close(self) -> None: ...
