"""The gateway's settings (`kvserve serve` flags, or a test's), with the defaults of its limits.
Plain data: the running gateway that reads them is `gateway.Gateway`."""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from kvserve.frontend.http.api_keys import DEFAULT_TENANT
from kvserve.frontend.http.cors_policy import CorsPolicy
from kvserve.frontend.http.host_policy import HostPolicy
from kvserve.frontend.openai import ToolSettings

DEFAULT_MAX_BODY = 4 * 1024 * 1024
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
# Slow clients (docs/security.md): a request's head must arrive within
# HEADER (from the connection's start or its previous response; an idle keep-alive connection
# closes after it too), its body within BODY of the head; a stream's unread output is capped.
# 75 s: aiohttp uses one timer for both, and an idle keep-alive connection must outlive a load
# balancer's own idle timeout (60 s on AWS ALB), else the balancer reuses a closed one (a 502).
DEFAULT_HEADER_TIMEOUT_S = 75.0
DEFAULT_BODY_TIMEOUT_S = 60.0
DEFAULT_MAX_STREAM_BUFFER = 8 * 1024 * 1024
# A stream whose client reads nothing for this long is cancelled (write_stall.py): long enough
# for a mobile client's network to come back, short enough that a stuck one frees its KV blocks.
DEFAULT_WRITE_TIMEOUT_S = 30.0


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
    write_timeout: float = DEFAULT_WRITE_TIMEOUT_S
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
    # Stored /v1/responses answers (previous_response_id): at most this many; 0 keeps none
    # (--disable-response-store). The byte bound is the store's own (responses_api/response_store.py).
    response_store_entries: int = 1024
    # LoRA adapters (docs/lora.md): a `model` that is not a served name goes to the backend as an
    # adapter's name. False: none are served; None: unknown (remote backends): learned by describe.
    enable_lora: bool | None = False
    allow_runtime_lora_updating: bool = False  # mounts /v1/load_lora_adapter and /v1/unload_lora_adapter
    server_dev_mode: bool = False  # mounts POST /reset_prefix_cache (vLLM's VLLM_SERVER_DEV_MODE)
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
