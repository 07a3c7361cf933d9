"""HTTP plumbing of the gateway: the aiohttp app and server, middlewares, the host, CORS and API-key
policies, tenant cache salts, body and write limits, SSE framing, graceful drain, and the
Gateway state the handlers share. It knows no OpenAI field."""
from __future__ import annotations

import importlib

# Public names -> the module that defines them, imported on first use (PEP 562). Sibling packages
# import only these names (tests/contract/test_import_rules.py), and nothing loads before it is used.
_EXPORTS = {
    "DEFAULT_BODY_TIMEOUT_S": ".gateway_config",
    "DEFAULT_HEADER_TIMEOUT_S": ".gateway_config",
    "DEFAULT_MAX_BODY": ".gateway_config",
    "DEFAULT_MAX_STREAM_BUFFER": ".gateway_config",
    "DEFAULT_SHUTDOWN_TIMEOUT_S": ".gateway_config",
    "DEFAULT_WRITE_TIMEOUT_S": ".gateway_config",
    "GATEWAY": ".gateway",
    "Gateway": ".gateway",
    "GatewayConfig": ".gateway_config",
    "SseWriter": ".sse_writer",
    "add_cors_flags": ".cors_policy",
    "add_host_flags": ".host_policy",
    "build_app": ".app",
    "cors_policy_from_args": ".cors_policy",
    "drain_gateway": ".drain",
    "effective_cache_salt": ".cache_salt",
    "host_policy_from_args": ".host_policy",
    "load_api_keys": ".api_keys",
    "load_secret": ".cache_salt",
    "read_json_body": ".request_body",
    "request_id": ".middleware",
    "request_span": ".middleware",
    "request_tenant": ".middleware",
    "start_app": ".app",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
