"""What the handlers share: configuration, the backend client, the tokenizer,
metrics and a short-lived readiness cache. One `Gateway` per aiohttp app.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from aiohttp import web

from kvserve.frontend.chat_template import FALLBACK_TEMPLATE
from kvserve.frontend.errors import ApiError, backend_unavailable, model_not_found
from kvserve.frontend.protocol import BackendClient
from kvserve.frontend.tokenizer import GatewayTokenizer
from kvserve.observability.metrics_gateway import GatewayMetrics

DEFAULT_MAX_BODY = 4 * 1024 * 1024


@dataclass(slots=True)
class GatewayConfig:
    served_model_names: list[str]
    model_root: str | None = None  # the model folder, reported as `root` by /v1/models
    api_key: str | None = None
    max_request_body_bytes: int = DEFAULT_MAX_BODY
    max_model_len: int | None = None  # known only when given as a flag; the engine checks anyway
    chat_template: str | None = None  # --chat-template text; overrides the tokenizer's
    log_requests: bool = False
    version: str = "0.1.0"


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

    def __post_init__(self) -> None:
        if self.readiness is None:
            self.readiness = ReadinessCache(self.backend)

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
            raise model_not_found(name)
        return name

    def require_tokenizer(self) -> GatewayTokenizer:
        if self.tokenizer is None:
            raise ApiError(400, "this server has no tokenizer: start it with --model or --tokenizer", code="tokenizer_unavailable")
        return self.tokenizer

    def chat_template(self) -> str:
        if self.config.chat_template:
            return self.config.chat_template
        tok = self.tokenizer
        return tok.chat_template if tok is not None and tok.chat_template else FALLBACK_TEMPLATE

    async def ensure_ready(self) -> None:
        assert self.readiness is not None
        if not await self.readiness.ready():
            raise backend_unavailable()


GATEWAY: web.AppKey[Gateway] = web.AppKey("kvserve_gateway", Gateway)
