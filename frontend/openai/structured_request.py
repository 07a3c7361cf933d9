"""The request fields that constrain decoding, translated into the one `structured_outputs`
sampling parameter the engine knows (vLLM's StructuredOutputsParams: see backend/structured/spec.py).

Accepted, one at a time: OpenAI's `response_format` (json_object, json_schema), vLLM's
`structured_outputs` object and its older `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar`. The constraint travels inside `sampling_parameters`, so a tritonserver running
model.py enforces it the same way. The engine compiles it and refuses what does not compile
("structured_outputs: ..."); the gateway then names the field the client actually sent.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvserve.frontend.openai.api_errors import bad_request, not_supported

FIELD = "structured_outputs"  # the sampling parameter (the engine names it in its errors)
MAX_CONSTRAINT_CHARS = 64 * 1024  # the engine's limit (backend/structured/spec.py MAX_SPEC_CHARS)
KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
# vLLM options beside the constraint that change how it is enforced: refused, not ignored.
_GUIDED_OPTIONS = ("guided_decoding_backend", "guided_whitespace_pattern")


@dataclass(frozen=True, slots=True)
class Constraint:
    value: dict[str, Any]  # {"json": schema} etc., as the engine takes it
    param: str  # the request field it came from, for error messages


def _set(value: Any) -> bool:
    # Only null is "not set": false, "" or [] are values, checked (and refused) like any other.
    return value is not None


def parse_constraint(body: dict[str, Any]) -> Constraint | None:
    found: list[Constraint] = []
    fmt = _response_format(body.get("response_format"))
    if fmt is not None:
        found.append(Constraint(fmt, "response_format"))
    if _set(body.get(FIELD)):
        found.append(Constraint(_structured_outputs(body[FIELD]), FIELD))
    for name, kind in _GUIDED.items():
        if _set(body.get(name)):
            found.append(Constraint({kind: body[name]}, name))
    for name in _GUIDED_OPTIONS:
        if _set(body.get(name)):
            raise not_supported(name, f"'{name}'")
    if len(found) > 1:
        raise bad_request(f"only one of {', '.join(c.param for c in found)} may be set",
                          param=found[1].param)
    if not found:
        return None
    constraint = found[0]
    _check_shape(constraint)
    return constraint


def _response_format(fmt: Any) -> dict[str, Any] | None:
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise bad_request("'response_format' must be an object with a 'type'", param="response_format")
    kind = fmt["type"]
    if kind not in ("text", "json_object", "json_schema"):
        raise not_supported("response_format", "a response_format type other than 'text', 'json_object' "
                                               "and 'json_schema'")
    spec = fmt.get("json_schema")
    if spec is None and kind == "json_schema":
        raise bad_request("'response_format.json_schema' is required with type json_schema", param="response_format")
    schema = None if spec is None else _json_schema_spec(spec)  # checked whatever the type: never ignored
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    return {"json": schema}


def _json_schema_spec(spec: Any) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise bad_request("'response_format.json_schema' must be an object", param="response_format")
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not 0 < len(name) <= 64):
        raise bad_request("'response_format.json_schema.name' must be a string of 1 to 64 characters",
                          param="response_format")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise bad_request("'response_format.json_schema.strict' must be a boolean", param="response_format")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise bad_request("'response_format.json_schema.schema' must be a JSON schema object",
                          param="response_format")
    return schema


def _structured_outputs(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_request(f"'{FIELD}' must be an object", param=FIELD)
    # vLLM's options beside the constraint (disable_any_whitespace, whitespace_pattern, backend...)
    # change how it is enforced: refused with the rest, not ignored.
    if any(k not in KINDS for k in value):
        raise bad_request(f"'{FIELD}' has a field other than {', '.join(KINDS)}", param=FIELD)
    chosen = {k: v for k, v in value.items() if _set(v) and not (k == "json_object" and v is False)}
    if len(chosen) != 1:
        raise bad_request(f"'{FIELD}' must set exactly one of {', '.join(KINDS)}", param=FIELD)
    return chosen


def _check_shape(c: Constraint) -> None:
    """What needs no compiler: types and size. The engine checks the rest (and again these)."""
    (kind, value), = c.value.items()
    if kind == "choice" and not (isinstance(value, list) and value and all(isinstance(v, str) and v for v in value)):
        raise bad_request(f"'{c.param}' choices must be a non-empty list of non-empty strings", param=c.param)
    if kind in ("regex", "grammar") and not (isinstance(value, str) and value):
        raise bad_request(f"'{c.param}' must be a non-empty string", param=c.param)
    if kind in ("json", "structural_tag") and not (isinstance(value, dict) or (isinstance(value, str) and value)):
        raise bad_request(f"'{c.param}' must be a JSON object (or its JSON text)", param=c.param)
    if kind == "json_object" and value is not True:
        raise bad_request(f"'{c.param}' json_object must be true", param=c.param)
    size = len(value) if isinstance(value, str) else len(json.dumps(value, ensure_ascii=False))
    if size > MAX_CONSTRAINT_CHARS:
        raise bad_request(f"'{c.param}' is larger than {MAX_CONSTRAINT_CHARS} characters", param=c.param)
