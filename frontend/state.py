"""What the handlers share: configuration, the backend client, the tokenizer,
metrics and a short-lived readiness cache. One `Gateway` per aiohttp app.
"""
from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from dataclasses import dataclass, field

from aiohttp import web

from kvserve.frontend.chat_template import FALLBACK_TEMPLATE
from kvserve.frontend.tools import ToolSettings
from kvserve.frontend.cors_policy import CorsPolicy
from kvserve.frontend.api_errors import ApiError, backend_unavailable, model_not_found, shutting_down
from kvserve.frontend.host_policy import HostPolicy
from kvserve.frontend.protocol import BackendClient, EmbeddingBackend
from kvserve.frontend.gateway_tokenizer import GatewayTokenizer
from kvserve.observability.metrics_gateway import GatewayMetrics

DEFAULT_MAX_BODY = 4 * 1024 * 1024
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
# Slow clients (README, "Failures, limits and security"): a request's head must arrive within
# HEADER (from the connection's start or its previous response; an idle keep-alive connection
# closes after it too), its body within BODY of the head; a stream's unread output is capped.
# 75 s: aiohttp uses one timer for both, and an idle keep-alive connection must outlive a load
# balancer's own idle timeout (60 s on AWS ALB), else the balancer reuses a closed one (a 502).
DEFAULT_HEADER_TIMEOUT_S = 75.0
DEFAULT_BODY_TIMEOUT_S = 60.0
DEFAULT_MAX_STREAM_BUFFER = 8 * 1024 * 1024
# Keys given with --api-key (not the keys file) belong to this tenant.
DEFAULT_TENANT = "default"


@dataclass(slots=True)
class GatewayConfig:
    served_model_names: list[str]
    model_root: str | None = None  # the model folder, reported as `root` by /v1/models
    api_key: str | None = None
    api_keys: dict[str, str] = field(default_factory=dict)  # key -> tenant, in addition to api_key
    max_request_body_bytes: int = DEFAULT_MAX_BODY
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout: float = DEFAULT_BODY_TIMEOUT_S
    max_stream_buffer_bytes: int = DEFAULT_MAX_STREAM_BUFFER
    # From the flag or the model folder; else learned from the backend (Gateway.learn_model_facts).
    max_model_len: int | None = None
    learn_served_name: bool = False  # no --served-model-name in front of remote backends: ask them
    chat_template: str | None = None  # --chat-template text; overrides the tokenizer's
    log_requests: bool = False
    version: str = "0.1.0"
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S  # in-flight requests get this long after SIGTERM
    cors: CorsPolicy = field(default_factory=CorsPolicy)  # off unless origins are given
    hosts: HostPolicy = field(default_factory=HostPolicy)  # Host header names answered (DNS rebinding)
    tools: ToolSettings = field(default_factory=ToolSettings)  # --enable-auto-tool-choice, --tool-call-parser
    embedding_model_names: list[str] = field(default_factory=list)  # served by Gateway.embedder
    embedding_model_root: str | None = None
    embedding_max_model_len: int | None = None
    # Keys the tenants' prefix-cache salts (cache_salt.py); serve_cmd loads the deployment's.
    cache_salt_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    def key_table(self) -> dict[str, str]:
        """Every accepted API key -> its tenant (empty: no authentication)."""
        table = dict(self.api_keys)
        if self.api_key:
            table.setdefault(self.api_key, DEFAULT_TENANT)
        return table


class ReadinessCache:
    """Generation routes answer 503 while the backend is not ready, without a
    gRPC round trip per request: a positive answer is trusted for a second, a
    negative one re-checked sooner so recovery is seen quickly."""

    def __init__(self, backend: BackendClient, ok_ttl: float = 1.0, bad_ttl: float = 0.2) -> None:
        self._backend = backend
        self._ttl = (bad_ttl, ok_ttl)
        self._value = False
        self._expires = 0.0
        self._lock = asyncio.Lock()

    async def ready(self) -> bool:
        if time.monotonic() < self._expires:
            return self._value
        async with self._lock:  # one probe for a burst of requests
            if time.monotonic() >= self._expires:
                self._value = await self._backend.ready()
                self._expires = time.monotonic() + self._ttl[self._value]
        return self._value

    def invalidate(self) -> None:
        self._expires = 0.0


@dataclass(slots=True)
class Gateway:
    config: GatewayConfig
    backend: BackendClient
    tokenizer: GatewayTokenizer | None = None
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    readiness: ReadinessCache | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    draining: bool = False  # SIGTERM received: readiness and new generation requests answer 503
    active: set = field(default_factory=set)  # Fanouts in flight (generation.py), aborted at the drain deadline
    key_digests: list = field(default_factory=list, init=False)  # [(sha256(key), tenant)] for middleware.auth
    facts_asked: bool = False  # learn_model_facts ran (or had nothing to learn)
    _facts_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    embedder: EmbeddingBackend | None = None  # the embedding model's backend (--embedding-model)
    embed_readiness: ReadinessCache | None = None

    def __post_init__(self) -> None:
        if self.readiness is None:
            self.readiness = ReadinessCache(self.backend)
        if self.embedder is not None and self.embed_readiness is None:
            self.embed_readiness = ReadinessCache(self.embedder)
        self.key_digests = [(hashlib.sha256(k.encode("utf-8")).digest(), t) for k, t in self.config.key_table().items()]

    @property
    def default_model(self) -> str:
        return self.config.served_model_names[0]

    @property
    def vocab_size(self) -> int | None:
        return self.tokenizer.vocab_size if self.tokenizer is not None else None

    def resolve_model(self, name: str | None) -> str:
        """The served name to report; a missing `model` means the default one."""
        if name is None:
            return self.default_model
        if name not in self.config.served_model_names:
            if name in self.config.embedding_model_names:
                raise ApiError(400, "the requested model is an embedding model: it serves only /v1/embeddings",
                               param="model", code="model_not_supported")
            raise model_not_found()
        return name

    def token_text(self, token_id: int) -> str:
        """A token's text for logprobs (the engine sends ids); vLLM's `token_id:N`
        form when this gateway has no tokenizer."""
        if self.tokenizer is None:
            return f"token_id:{token_id}"
        return self.tokenizer.token_text(token_id)

    def require_tokenizer(self) -> GatewayTokenizer:
        if self.tokenizer is None:
            raise ApiError(400, "this server has no tokenizer: start it with --model or --tokenizer", code="tokenizer_unavailable")
        return self.tokenizer

    def chat_template(self) -> str:
        if self.config.chat_template:
            return self.config.chat_template
        tok = self.tokenizer
        return tok.chat_template if tok is not None and tok.chat_template else FALLBACK_TEMPLATE

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
        if not self.facts_asked:
            await self.learn_model_facts()

    async def learn_model_facts(self) -> None:
        """Ask a ready backend for what the flags left unknown: the context length (so chat
        without max_tokens gets "up to the context", not the engine's default of 16) and the
        served name. Once: a backend that cannot tell (an older model) is not asked again."""
        async with self._facts_lock:
            if self.facts_asked or (self.config.max_model_len is not None and not self.config.learn_served_name):
                self.facts_asked = True
                return
            facts = await self.backend.describe()
            self.facts_asked = True
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
            else:
                await asyncio.sleep(interval_s)


GATEWAY: web.AppKey[Gateway] = web.AppKey("kvserve_gateway", Gateway)
