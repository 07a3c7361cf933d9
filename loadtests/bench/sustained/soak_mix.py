"""The soak's constrained requests: a JSON schema, a JSON object, a forced tool call; and the
check of their answers (a constrained answer that does not parse is a failure of the server,
however healthy its processes look).

An answer cut at max_tokens (finish_reason "length") is counted as truncated, not checked: a
grammar bounds what the model may write, not how long it takes to close the object.
"""
from __future__ import annotations

import json
import random
from typing import Any

import jsonschema


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


# Bounded strings and arrays, so a small model closes each object well within max_tokens; between
# them the keywords a grammar must enforce: enums, patterns, number bounds, nesting, $ref, formats.
_NAME = {"type": "string", "minLength": 1, "maxLength": 16}
SCHEMAS: dict[str, dict[str, Any]] = {
    "person": _obj({"name": _NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    "colour": _obj({"colour": {"enum": ["red", "green", "blue"]}, "shade": {"type": "number", "minimum": 0,
                                                                           "maximum": 1}}),
    "address": _obj({"city": _NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}),
    "order": _obj({"items": {"type": "array", "minItems": 1, "maxItems": 2,
                             "items": _obj({"sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
                                            "qty": {"type": "integer", "minimum": 1, "maximum": 9}})}}),
    "point_pair": {"$defs": {"pt": _obj({"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                         "y": {"type": "integer", "minimum": -9, "maximum": 9}})},
                   **_obj({"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}})},
    "event": _obj({"title": _NAME, "day": {"type": "string", "format": "date"}, "public": {"type": "boolean"}},
                  required=["title", "day"]),
}
CONSTRAINED_KINDS = ("json_schema", "json_object", "tools")
_CHECKER = jsonschema.FormatChecker()
_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 20},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Current time in a timezone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 30}},
                       "required": ["tz"], "additionalProperties": False}}},
]
_TOOL_PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in _TOOLS}
_ASKS = ["What is the weather in Paris right now?", "What time is it in Tokyo?",
         "Is it raining in Oslo? Answer in celsius."]


def constrained_body(kind: str, rng: random.Random) -> dict[str, Any]:
    """The chat fields of one constrained request of `kind` (model, stream and max_tokens are the caller's)."""
    if kind == "json_schema":
        name = rng.choice(sorted(SCHEMAS))
        return {"messages": [{"role": "user", "content": f"Give me one example '{name.replace('_', ' ')}' "
                                                          "record as JSON."}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}}
    if kind == "json_object":
        return {"messages": [{"role": "user", "content": "Describe a cat as a small JSON object with two keys."}],
                "response_format": {"type": "json_object"}}
    if kind == "tools":
        choice: Any = "required" if rng.random() < 0.5 else {
            "type": "function", "function": {"name": rng.choice(sorted(_TOOL_PARAMS))}}
        return {"messages": [{"role": "user", "content": rng.choice(_ASKS)}], "tools": _TOOLS, "tool_choice": choice}
    raise ValueError(f"not a constrained kind: {kind}")


def check_answer(kind: str, body: dict[str, Any], content: str | None, tool_calls: list[dict[str, Any]],
                 finish_reason: str | None) -> str:
    """'valid', 'truncated' or 'invalid: why' for one choice of a constrained answer; `tool_calls`
    are {"name", "arguments"} dicts (joined from the deltas for a stream)."""
    if finish_reason == "length":
        return "truncated"
    try:
        if kind == "tools":
            if finish_reason != "tool_calls" or not tool_calls:
                return f"invalid: finish_reason {finish_reason!r} with {len(tool_calls)} tool calls"
            forced = body["tool_choice"]
            for call in tool_calls:
                if call["name"] not in _TOOL_PARAMS:
                    return f"invalid: unknown tool {call['name']!r}"
                if isinstance(forced, dict) and call["name"] != forced["function"]["name"]:
                    return f"invalid: called {call['name']!r}, not the named tool"
                jsonschema.validate(json.loads(call["arguments"]), _TOOL_PARAMS[call["name"]])
            return "valid"
        if finish_reason != "stop":
            return f"invalid: finish_reason {finish_reason!r}"
        value = json.loads(content or "")
        if kind == "json_object":
            return "valid" if isinstance(value, dict) else f"invalid: a JSON {type(value).__name__}, not an object"
        jsonschema.validate(value, body["response_format"]["json_schema"]["schema"], format_checker=_CHECKER)
        return "valid"
    except json.JSONDecodeError as exc:
        return f"invalid: not JSON ({exc.msg} at {exc.pos}: {exc.doc[max(0, exc.pos - 20):exc.pos + 20]!r})"
    except jsonschema.ValidationError as exc:
        return f"invalid: schema ({exc.message[:120]})"


def message_of(answer: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]], str | None]:
    """(content, tool calls, finish_reason) of the first choice of a non-streaming chat answer."""
    choice = answer["choices"][0]
    msg = choice.get("message") or {}
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
             for c in msg.get("tool_calls") or []]
    return msg.get("content"), calls, choice.get("finish_reason")


class StreamJoin:
    """Joins a chat stream's deltas into what message_of reads from a whole answer."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.finish_reason: str | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        for choice in chunk.get("choices") or []:
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
            for d in delta.get("tool_calls") or []:
                slot = self.calls.setdefault(d.get("index", 0), {"name": "", "arguments": ""})
                fn = d.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""

    def joined(self) -> tuple[str | None, list[dict[str, Any]], str | None]:
        return "".join(self.content), [self.calls[i] for i in sorted(self.calls)], self.finish_reason
