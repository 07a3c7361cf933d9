"""The Responses API's request and response schemas for /openapi.json (openapi.py mounts them),
with the bounds responses_request.py and the chat parser check, so that a schema-driven fuzzer's
valid requests are accepted and its invalid ones refused."""
from __future__ import annotations

from typing import Any

from kvserve.frontend.openai.tools import MAX_TOOLS
from kvserve.frontend.openai.responses_api.responses_request import MAX_METADATA
from kvserve.seam.limits import MAX_LOGPROBS


def _number(lo: float, hi: float | None = None, *, integer: bool = False, exclusive_lo: bool = False) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "integer" if integer else "number", "minimum": lo, "nullable": True}
    if hi is not None:
        s["maximum"] = hi
    if exclusive_lo:
        s["exclusiveMinimum"] = True
    return s


def responses_schemas() -> dict[str, Any]:
    item = {"type": "object", "description": "a message (role, content: a string or input_text parts), or a "
                                             "function_call or function_call_output item"}
    tool = {"type": "object", "required": ["type", "name"], "properties": {
        "type": {"type": "string", "enum": ["function"]},
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
        "description": {"type": "string"}, "parameters": {"type": "object"}}}
    fmt = {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
        "name": {"type": "string", "minLength": 1, "maxLength": 64},
        "schema": {"type": "object", "description": "with type json_schema (required there)"},
        "strict": {"type": "boolean", "nullable": True}}}
    boolean = {"type": "boolean", "nullable": True}
    output_item = {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["message", "function_call"]}, "id": {"type": "string"}}}
    return {
        "ResponsesRequest": {"type": "object", "required": ["input"], "properties": {
            "model": {"type": "string", "maxLength": 512, "nullable": True},
            "input": {"oneOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1, "items": item}]},
            "instructions": {"type": "string", "nullable": True},
            "max_output_tokens": _number(1, integer=True),
            "temperature": _number(0, 2),
            "top_p": _number(0, 1, exclusive_lo=True),
            "stream": boolean, "store": boolean,
            "background": {**boolean, "description": "true is refused: background responses are not served"},
            "previous_response_id": {"type": "string", "minLength": 1, "maxLength": 128, "nullable": True},
            "tools": {"type": "array", "maxItems": MAX_TOOLS, "items": tool, "nullable": True},
            "tool_choice": {"nullable": True, "oneOf": [
                {"type": "string", "enum": ["none", "auto", "required"]},
                {"type": "object", "required": ["type", "name"], "properties": {
                    "type": {"type": "string", "enum": ["function"]}, "name": {"type": "string"}}}]},
            "parallel_tool_calls": boolean,
            "text": {"type": "object", "nullable": True, "properties": {"format": fmt}},
            "metadata": {"type": "object", "nullable": True, "maxProperties": MAX_METADATA,
                         "additionalProperties": {"type": "string", "maxLength": 512}},
            "truncation": {"type": "string", "enum": ["disabled", "auto"], "nullable": True,
                           "description": "auto: the oldest input items are dropped until the input fits"},
            "user": {"type": "string", "maxLength": 256, "nullable": True},
            "include": {"type": "array", "nullable": True,
                        "items": {"type": "string", "enum": ["message.output_text.logprobs"]},
                        "description": "message.output_text.logprobs: each output_text part (and delta) lists its "
                                       "tokens' logprobs; other values are refused"},
            "top_logprobs": {**_number(0, MAX_LOGPROBS, integer=True), "description": "alternatives per token"},
        }},
        "Response": {"type": "object", "required": ["id", "object", "created_at", "status", "model", "output"],
                     "properties": {
            "id": {"type": "string"}, "object": {"type": "string", "enum": ["response"]},
            "created_at": {"type": "integer"}, "model": {"type": "string"},
            "status": {"type": "string", "enum": ["completed", "incomplete", "in_progress", "failed"]},
            "output": {"type": "array", "items": output_item},
            "previous_response_id": {"type": "string", "nullable": True},
            "usage": {"type": "object", "nullable": True, "required": ["input_tokens", "output_tokens", "total_tokens"],
                      "properties": {"input_tokens": {"type": "integer"}, "output_tokens": {"type": "integer"},
                                     "total_tokens": {"type": "integer"}}}}},
        "DeletedResponse": {"type": "object", "required": ["id", "object", "deleted"], "properties": {
            "id": {"type": "string"}, "object": {"type": "string"}, "deleted": {"type": "boolean"}}},
    }
