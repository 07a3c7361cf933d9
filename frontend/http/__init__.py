"""HTTP plumbing of the gateway: the aiohttp app and server, middlewares, the host, CORS and API-key
policies, tenant cache salts, body and write limits, SSE framing, graceful drain, and the
Gateway state the handlers share. It knows no OpenAI field."""
from __future__ import annotations

from kvserve.frontend import exports_loader

# Public names -> the module that defines them. Sibling packages import only these names
# (tests/contract/test_import_rules.py), and each loads on first use.
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
    "request_key_id": ".middleware",
    "request_span": ".middleware",
    "request_tenant": ".middleware",
    "response_id": ".middleware",
    "start_app": ".app",
}
__all__ = sorted(_EXPORTS)
__getattr__ = exports_loader(__name__, _EXPORTS)
