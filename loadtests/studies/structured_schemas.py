"""The JSON schema set of the structured-output tests and benchmark (loadtests/studies/structured_bench.py):
nested objects, arrays with minItems/maxItems, enums, patterns, bounded numbers, required fields, additionalProperties false.
Strings and arrays are bounded so a small model finishes them within a short max_tokens."""
from __future__ import annotations


def _obj(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


NAME = {"type": "string", "minLength": 1, "maxLength": 16}

SCHEMAS: dict[str, dict] = {
    "person": _obj({"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    "colour_enum": _obj({"colour": {"enum": ["red", "green", "blue"]}}),
    "nested_address": _obj({"name": NAME, "address": _obj({"city": NAME, "zip": {"type": "string",
                                                                                  "pattern": "^[0-9]{5}$"}})}),
    "string_array": _obj({"tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                                   "minItems": 2, "maxItems": 3}}),
    "object_array": _obj({"items": {"type": "array", "minItems": 1, "maxItems": 2,
                                    "items": _obj({"sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
                                                   "qty": {"type": "integer", "minimum": 1, "maximum": 9}})}}),
    "pattern_code": _obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}}),
    "bounded_float": _obj({"score": {"type": "number", "minimum": 0.5, "maximum": 9.5}}),
    "exclusive_bounds": _obj({"n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}}),
    "nullable_union": _obj({"value": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}}),
    "const_version": _obj({"version": {"const": "v1"}, "ok": {"type": "boolean"}}),
    "defs_ref": {"$defs": {"pt": _obj({"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                       "y": {"type": "integer", "minimum": -9, "maximum": 9}})},
                 **_obj({"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}})},
    "three_levels": _obj({"l1": _obj({"l2": _obj({"l3": {"type": "integer", "minimum": 0, "maximum": 5}})})}),
    "int_enum": _obj({"level": {"enum": [1, 2, 3]}, "label": {"enum": ["low", "mid", "high"]}}),
    "date_format": _obj({"day": {"type": "string", "format": "date"}}),
    "optional_fields": _obj({"title": NAME, "subtitle": NAME, "year": {"type": "integer", "minimum": 1900,
                                                                         "maximum": 2100}},
                            required=["title"]),
    "string_lengths": _obj({"word": {"type": "string", "minLength": 3, "maxLength": 6}}),
    "enum_array": _obj({"days": {"type": "array", "items": {"enum": ["mon", "tue", "wed"]},
                                 "minItems": 1, "maxItems": 3}}),
    "tuple_prefix": _obj({"pair": {"type": "array", "prefixItems": [NAME, {"type": "integer", "minimum": 0,
                                                                             "maximum": 99}],
                                   "items": False, "minItems": 2, "maxItems": 2}}),
    "email_pattern": _obj({"email": {"type": "string", "pattern": "^[a-z]{1,10}@[a-z]{1,10}[.](com|org)$"}}),
    "mixed_flags": _obj({"active": {"type": "boolean"}, "counts": {"type": "array", "minItems": 1, "maxItems": 3,
                                                                   "items": {"type": "integer", "minimum": 0,
                                                                             "maximum": 99}}}),
}
assert len(SCHEMAS) == 20
