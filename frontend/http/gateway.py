"""What the handlers share: the configuration, the backend client, the tokenizer,
metrics and the readiness caches. One `Gateway` per aiohttp app, under `GATEWAY`.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from aiohttp import web

from kvserve.frontend.backend_client import (BackendClient, BackendError, BackendUnavailable, EmbeddingBackend,
                                             LoRAAdapterInfo, LoRAControl, ReadinessCache)
from kvserve.frontend.http.api_keys import key_digest
from kvserve.frontend.http.gateway_config import GatewayConfig
from kvserve.frontend.openai import ApiError, backend_unavailable, model_not_found, shutting_down
from kvserve.observability.metrics_gateway import GatewayMetrics
from kvserve.seam.tokenizer import ModelTokenizer

# How long requests wait before asking a backend whose describe failed in transport again (each
# attempt can cost the describe timeout; the start-up loop keeps asking every second meanwhile).
FACTS_RETRY_S = 5.0


@dataclass(slots=True)
class Gateway:
    config: GatewayConfig
    backend: BackendClient
    tokenizer: ModelTokenizer | None = None
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    readiness: ReadinessCache | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    draining: bool = False  # SIGTERM received: readiness and new generation requests answer 503
    active: set = field(default_factory=set)  # Fanouts in flight (generation.py), aborted at the drain deadline
    key_digests: list = field(default_factory=list, init=False)  # [(key_digest(key), tenant)] for middleware.auth
    facts_asked: bool = False  # learn_model_facts got an answer (or had nothing to learn)
    _facts_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    _facts_retry_at: float = field(default=0.0, init=False)  # monotonic time before which requests don't ask again
    embedder: EmbeddingBackend | None = None  # the embedding model's backend (--embedding-model)
    embed_readiness: ReadinessCache | None = None

    def __post_init__(self) -> None:
        if self.readiness is None:
            self.readiness = ReadinessCache(self.backend)
        if self.embedder is not None and self.embed_readiness is None:
            self.embed_readiness = ReadinessCache(self.embedder)
        self.key_digests = [(key_digest(k), t) for k, t in self.config.key_table().items()]

    @property
    def default_model(self) -> str:
        return self.config.served_model_names[0]

    @property
    def vocab_size(self) -> int | None:
        return self.tokenizer.vocab_size if self.tokenizer is not None else None

    def resolve_model(self, name: str | None) -> str:
        """The served name to report; a missing `model` means the default one. With LoRA on, any
        other name is an adapter's: the backend resolves it (unknown: 404 model_not_found then),
        so adapters loaded at run time, or through another gateway, need no list here."""
        if name is None:
            return self.default_model
        if name not in self.config.served_model_names:
            if name in self.config.embedding_model_names:
                raise ApiError(400, "the requested model is an embedding model: it serves only /v1/embeddings, "
                                    "/v1/score and /v1/rerank",
                               param="model", code="model_not_supported")
            if not self.lora_possible:
                raise model_not_found()
        return name

    @property
    def lora_possible(self) -> bool:
        """The backend may serve LoRA adapters (it does, or has not said yet)."""
        return self.config.enable_lora is not False and isinstance(self.backend, LoRAControl)

    def lora_of(self, model: str) -> str | None:
        """The adapter a resolved `model` names; None: the base model."""
        return None if model in self.config.served_model_names else model

    async def lora_adapters(self) -> list[LoRAAdapterInfo]:
        """The adapters the backend serves now ([] when none, or it cannot say)."""
        if not self.lora_possible:
            return []
        try:
            return await self.backend.lora_control("list")  # type: ignore[attr-defined]
        except BackendError:
            return []

    async def lora_adapter(self, name: str) -> LoRAAdapterInfo | None:
        """The adapter the backend serves under `name`, if any."""
        return next((a for a in await self.lora_adapters() if a.name == name), None)

    async def resolve_known_model(self, name: str | None) -> str:
        """resolve_model for routes that do not reach the engine (/tokenize, /v1/models/{id}): an
        adapter's name must be one the backend lists."""
        model = self.resolve_model(name)
        if self.lora_of(model) is not None and await self.lora_adapter(model) is None:
            raise model_not_found()
        return model

    def token_text(self, token_id: int) -> str:
        """A token's text for logprobs (the engine sends ids); vLLM's `token_id:N`
        form when this gateway has no tokenizer."""
        if self.tokenizer is None:
            return f"token_id:{token_id}"
        return self.tokenizer.token_text(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """A token's own bytes for logprobs (seam/token_bytes.py); those of its `token_id:N`
        form when this gateway has no tokenizer."""
        if self.tokenizer is None:
            return self.token_text(token_id).encode()
        return self.tokenizer.token_bytes(token_id)

    def require_tokenizer(self) -> ModelTokenizer:
        if self.tokenizer is None:
            raise ApiError(400, "this server has no tokenizer: start it with --model or --tokenizer", code="tokenizer_unavailable")
        return self.tokenizer

    def chat_template(self) -> str:
        """The --chat-template, else the model's own. A model with none (a base model) has no chat
        format to guess: a made-up one would give text the model was never trained on."""
        if self.config.chat_template:
            return self.config.chat_template
        tok = self.tokenizer
        if tok is not None and tok.chat_template:
            return tok.chat_template
        raise ApiError(400, "this model has no chat template, so it cannot answer chat requests: start the "
                       "server with --chat-template FILE, or use /v1/completions", param="messages",
                       code="chat_template_missing")

    async def ensure_embedder_ready(self) -> None:
        if self.draining:
            raise shutting_down()
        if self.embed_readiness is None or not await self.embed_readiness.ready():
            raise backend_unavailable("the embedding model is not ready")

    async def ensure_ready(self) -> None:
        assert self.readiness is not None
        if self.draining:
            raise shutting_down()
        if not await self.readiness.ready():
            raise backend_unavailable()
        if not self.facts_asked and time.monotonic() >= self._facts_retry_at:
            await self.learn_model_facts()

    async def learn_model_facts_if_ready(self) -> None:
        """For /v1/models: a ready backend's facts are learned before the list is answered (a
        client asking right after start-up must not see the defaults); never fails."""
        if self.facts_asked or self.draining or time.monotonic() < self._facts_retry_at:
            return
        assert self.readiness is not None
        if await self.readiness.ready():
            await self.learn_model_facts()

    async def learn_model_facts(self) -> None:
        """Ask a ready backend for what the flags left unknown: the context length (so chat
        without max_tokens gets "up to the context", not the engine's default of 16) and the
        served name. Once answered: a backend that cannot tell (an older model) is not asked again.
        A describe that failed in transport (a timeout while the host was busy) answered nothing:
        it is asked again, by requests at most every FACTS_RETRY_S and by the start-up loop."""
        async with self._facts_lock:
            if self.facts_asked or (self.config.max_model_len is not None and not self.config.learn_served_name
                                    and self.config.enable_lora is not None):
                self.facts_asked = True
                return
            try:
                facts = await self.backend.describe()
            except BackendUnavailable:
                self._facts_retry_at = time.monotonic() + FACTS_RETRY_S
                return
            self.facts_asked = True
            if self.config.enable_lora is None:  # a model that cannot say serves no adapters
                self.config.enable_lora = bool(facts is not None and facts.enable_lora)
            if facts is None:
                return
            if self.config.max_model_len is None and facts.max_model_len is not None:
                self.config.max_model_len = facts.max_model_len
            if self.config.learn_served_name and facts.served_model_name:
                self.config.served_model_names = [facts.served_model_name]

    async def learn_model_facts_when_ready(self, interval_s: float = 1.0) -> None:
        """At startup, so /v1/models names the model before the first request."""
        while not self.facts_asked:
            if await self.backend.ready():
                await self.learn_model_facts()
            if not self.facts_asked:
                await asyncio.sleep(interval_s)


GATEWAY: web.AppKey[Gateway] = web.AppKey("kvserve_gateway", Gateway)
