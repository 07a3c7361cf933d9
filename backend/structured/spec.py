"""The `structured_outputs` sampling parameter: one constraint, checked and put in canonical form.

The wire form is vLLM's StructuredOutputsParams, exactly one of:
    {"json": <schema object or its JSON text>}   {"json_object": true}
    {"regex": "..."}   {"choice": ["a", "b"]}   {"grammar": "<EBNF>"}
    {"structural_tag": <xgrammar structural tag object or its JSON text>}
The gateway translates OpenAI's response_format, tools and vLLM's guided_* names into it, so a
client of tritonserver sends the same object. Everything here is pure Python (no xgrammar):
the checks that need no compiler run in SamplingParams' validation, before a request queues.

xgrammar silently ignores JSON-schema keywords it cannot enforce (`not`, `if`, `uniqueItems`,
`multipleOf` on numbers...). Output that ignores part of the schema is what this feature exists to
prevent, so such keywords are refused here instead, naming the keyword.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvserve.seam.error_wire import invalid

FIELD = "structured_outputs"
KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")
MAX_SPEC_CHARS = 64 * 1024  # a schema, regex or grammar in its canonical text
MAX_CHOICES = 1024
MAX_SCHEMA_DEPTH = 32

# Keywords xgrammar enforces (checked against its matcher: tests/backend/structured/test_structured.py) ...
_ENFORCED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
    "maxItems", "enum", "const", "pattern", "minLength", "maxLength", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "anyOf", "$ref", "$defs", "definitions", "format",
    "minProperties", "maxProperties",
})
# ... and those that only annotate (nothing to enforce).
_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "strict",
})
# Every keyword of JSON Schema 2020-12 (and draft-07's `definitions`, `dependencies`): only these are
# named back in an error; anything else is user text, and error messages quote none of it.
_VOCABULARY = _ENFORCED | _ANNOTATIONS | frozenset({
    "not", "allOf", "oneOf", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
    "patternProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems", "contains",
    "minContains", "maxContains", "uniqueItems", "multipleOf", "contentEncoding", "contentMediaType",
    "contentSchema", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary", "$recursiveRef",
    "$recursiveAnchor",
})
_FORMATS = frozenset({"date", "time", "date-time", "email", "uuid", "uri", "ipv4", "ipv6", "duration"})
_STRING_BOUNDS = frozenset({"minLength", "maxLength", "pattern"})  # xgrammar drops them beside a format
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "prefixItems")
_SCHEMA_OR_BOOL = ("items", "additionalProperties")


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    kind: str  # one of KINDS
    text: str  # canonical text: schema JSON (sorted keys), regex, EBNF, or structural tag JSON

    @property
    def key(self) -> tuple[str, str]:
        """Cache key of the compiled grammar: equal specs compile once."""
        return self.kind, self.text


def parse_spec(value: Any) -> GrammarSpec:
    """The checks that need no compiler; ValueError names `structured_outputs`."""
    if not isinstance(value, dict):
        raise invalid(FIELD, f"must be an object with one of {', '.join(KINDS)}")
    options = {k: v for k, v in value.items() if v is not None and v is not False}
    unknown = sorted(set(options) - set(KINDS))
    if unknown:
        raise invalid(FIELD, f"has a key other than {', '.join(KINDS)}")
    if len(options) != 1:
        raise invalid(FIELD, f"exactly one of {', '.join(KINDS)} must be set")
    kind, raw = next(iter(options.items()))
    if kind == "json_object":
        if raw is not True:
            raise invalid(FIELD, "json_object must be true")
        return GrammarSpec(kind, "")
    if kind == "choice":
        if (not isinstance(raw, list) or not raw or len(raw) > MAX_CHOICES
                or not all(isinstance(c, str) and c for c in raw)):
            raise invalid(FIELD, f"choice must be a list of 1 to {MAX_CHOICES} non-empty strings")
        return _bounded(GrammarSpec(kind, _choice_grammar(raw)))
    if kind in ("json", "structural_tag"):
        doc = _json_value(raw, kind)
        if kind == "json":
            check_schema(doc)
        elif not isinstance(doc, dict):
            raise invalid(FIELD, "structural_tag must be an object")
        return _bounded(GrammarSpec(kind, json.dumps(doc, sort_keys=True, separators=(",", ":"),
                                                      ensure_ascii=False)))
    if not isinstance(raw, str) or not raw:
        raise invalid(FIELD, f"{kind} must be a non-empty string")
    return _bounded(GrammarSpec(kind, raw))


def _bounded(spec: GrammarSpec) -> GrammarSpec:
    if len(spec.text) > MAX_SPEC_CHARS:
        raise invalid(FIELD, f"the {spec.kind} constraint is longer than {MAX_SPEC_CHARS} characters")
    try:
        spec.text.encode("utf-8")  # the compiler takes UTF-8; JSON's "\ud800" escapes decode to what it cannot
    except UnicodeEncodeError:
        raise invalid(FIELD, f"the {spec.kind} constraint holds a lone surrogate, which is not text") from None
    return spec


def _json_value(raw: Any, kind: str) -> Any:
    if isinstance(raw, str):
        if len(raw) > MAX_SPEC_CHARS:
            raise invalid(FIELD, f"the {kind} constraint is longer than {MAX_SPEC_CHARS} characters")
        try:
            return json.loads(raw)
        except ValueError:
            raise invalid(FIELD, f"{kind} is not valid JSON") from None
    return raw


def _choice_grammar(choices: list[str]) -> str:
    # JSON string literals are EBNF string literals in xgrammar (same escapes).
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def check_schema(schema: Any) -> None:
    """A JSON Schema (Draft 2020-12) whose every keyword xgrammar enforces."""
    if not isinstance(schema, (dict, bool)):
        raise invalid(FIELD, "the JSON schema must be an object")
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        keyword = next((str(p) for p in reversed(exc.path) if str(p) in _VOCABULARY), None)
        where = f" (a {keyword!r} keyword's value is wrong)" if keyword else ""
        raise invalid(FIELD, f"not a valid JSON schema{where}") from None
    _check_keywords(schema, 0)


def _check_keywords(node: Any, depth: int) -> None:
    if isinstance(node, bool):
        return
    if depth > MAX_SCHEMA_DEPTH:
        raise invalid(FIELD, f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
    for key, value in node.items():
        if key not in _ENFORCED and key not in _ANNOTATIONS:
            if key in _VOCABULARY:
                raise invalid(FIELD, f"the JSON schema keyword {key!r} is not supported")
            raise invalid(FIELD, "the JSON schema has a keyword that is not a JSON Schema keyword")
        if key == "format" and _STRING_BOUNDS & node.keys():
            raise invalid(FIELD, "a string format cannot be combined with minLength, maxLength or pattern "
                                 "(the format alone is enforced)")
        if key == "format" and value not in _FORMATS:
            raise invalid(FIELD, f"a string format in the JSON schema is not supported "
                             f"(supported: {', '.join(sorted(_FORMATS))})")
        if key == "$ref" and not str(value).startswith("#"):
            raise invalid(FIELD, "only local $ref ('#/...') is supported in the JSON schema")
        if key in _SCHEMA_MAPS:
            for sub in value.values():
                _check_keywords(sub, depth + 1)
        elif key in _SCHEMA_LISTS:
            for sub in value:
                _check_keywords(sub, depth + 1)
        elif key in _SCHEMA_OR_BOOL:
            _check_keywords(value, depth + 1)
