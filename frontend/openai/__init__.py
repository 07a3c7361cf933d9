"""The OpenAI routes (completions, chat, responses, embeddings, models, tokenize) and their helpers:
request parsing, the chat template, tools and tool parsers, structured requests, logprobs, response
bodies, the OpenAI error objects, the OpenAPI description, and the table of routes the app mounts.
Nested: responses_api/ (the Responses API) and anthropic/ (Anthropic's Messages API), both on the
chat completions path, and scoring/ (vLLM's score and rerank APIs, on the embedding model)."""
from __future__ import annotations

from kvserve.frontend import exports_loader

# Public names -> the module that defines them. Sibling packages import only these names
# (tests/contract/test_import_rules.py), and each loads on first use.
_EXPORTS = {
    "ApiError": ".api_errors",
    "PUBLIC_PATHS": ".openapi",
    "TOOL_PARSERS": ".tools",
    "ToolSettings": ".tools",
    "add_routes": ".routes",
    "backend_unavailable": ".api_errors",
    "bad_request": ".api_errors",
    "error_response": ".anthropic.anthropic_errors",
    "internal_error": ".api_errors",
    "model_not_found": ".api_errors",
    "resolve_template_arg": ".chat_template",
    "shutting_down": ".api_errors",
}
__all__ = sorted(_EXPORTS)
__getattr__ = exports_loader(__name__, _EXPORTS)
