"""The Messages API's request and response schemas for /openapi.json (openapi.py mounts them),
with the bounds messages_request.py and the chat parser check, so that a schema-driven fuzzer's
valid requests are accepted and its invalid ones refused."""
from __future__ import annotations

from typing import Any

from kvserve.frontend.openai.tools import MAX_TOOLS
from kvserve.seam.limits import MAX_STOP, MAX_STOP_CHARS


def _number(lo: float, hi: float | None = None, *, integer: bool = False, exclusive_lo: bool = False) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "integer" if integer else "number", "minimum": lo}
    if hi is not None:
        s["maximum"] = hi
    if exclusive_lo:
        s["exclusiveMinimum"] = True
    return s


def messages_schemas() -> dict[str, Any]:
    text_block = {"type": "object", "required": ["type", "text"], "properties": {
        "type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}
    block = {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}},
             "description": "text; tool_use (assistant: id, name, input); tool_result (user: tool_use_id, content)"}
    message = {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"type": "string", "enum": ["user", "assistant"]},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": block}]}}}
    tool = {"type": "object", "required": ["name", "input_schema"], "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
        "description": {"type": "string"}, "input_schema": {"type": "object"},
        "type": {"type": "string", "enum": ["custom"]}}}
    tool_choice = {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]},
        "name": {"type": "string", "description": "with type tool"},
        "disable_parallel_tool_use": {"type": "boolean"}}}
    content_out = {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["text", "tool_use"]}, "text": {"type": "string"},
        "id": {"type": "string"}, "name": {"type": "string"}, "input": {"type": "object"}}}
    request_props = {
        "model": {"type": "string", "maxLength": 512},
        "messages": {"type": "array", "minItems": 1, "items": message},
        "max_tokens": _number(1, integer=True),
        "system": {"oneOf": [{"type": "string"}, {"type": "array", "items": text_block}]},
        "stop_sequences": {"type": "array", "maxItems": MAX_STOP,
                           "items": {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}},
        "stream": {"type": "boolean"},
        "temperature": _number(0, 2),
        "top_p": _number(0, 1, exclusive_lo=True),
        "top_k": _number(-1, integer=True),
        "tools": {"type": "array", "maxItems": MAX_TOOLS, "items": tool},
        "tool_choice": tool_choice,
        "thinking": {"type": "object", "required": ["type"], "description": "only type disabled is served",
                     "properties": {"type": {"type": "string", "enum": ["enabled", "disabled"]}}},
    }
    return {
        "MessagesRequest": {"type": "object", "required": ["model", "messages", "max_tokens"],
                            "properties": request_props},
        "CountTokensRequest": {"type": "object", "required": ["model", "messages"], "properties": request_props},
        "TokenCount": {"type": "object", "required": ["input_tokens"],
                       "properties": {"input_tokens": {"type": "integer"}}},
        "Message": {"type": "object", "required": ["id", "type", "role", "content", "model", "stop_reason", "usage"],
                    "properties": {
            "id": {"type": "string"}, "type": {"type": "string", "enum": ["message"]},
            "role": {"type": "string", "enum": ["assistant"]}, "model": {"type": "string"},
            "content": {"type": "array", "items": content_out},
            "stop_reason": {"type": "string", "enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]},
            "stop_sequence": {"type": "string", "nullable": True},
            "usage": {"type": "object", "required": ["input_tokens", "output_tokens"], "properties": {
                "input_tokens": {"type": "integer"}, "output_tokens": {"type": "integer"}}}}},
    }
