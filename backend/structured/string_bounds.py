"""Length-bounded JSON strings as patterns, so their grammar excludes raw control characters.

xgrammar 0.2.8 compiles a string with minLength/maxLength (and no pattern) to
`"` [^"\\\\\\r\\n]{min,max} `"`: it lets through U+0000-U+001F other than CR and LF (a raw tab,
\\x04...), which JSON forbids unescaped, so a constrained answer could fail json.loads (the soak
caught it). Its unbounded string rule excludes them. The same bounds written as a pattern are
enforced over the same characters without the control ones; escapes stay excluded, as before.
"""
from __future__ import annotations

from typing import Any

# Values of these keywords are data, not subschemas: a dict in them is never rewritten.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# These map names (which may be any word, "const" too) to subschemas.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def bounded_strings_as_patterns(node: Any) -> Any:
    """A copy of the schema `node` with each length-bounded string (no pattern, no format) rewritten."""
    if isinstance(node, list):
        return [bounded_strings_as_patterns(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: bounded_strings_as_patterns(sub) for name, sub in value.items()}
        else:
            out[key] = value if key in _DATA_KEYWORDS else bounded_strings_as_patterns(value)
    low, high = out.get("minLength", 0), out.get("maxLength")
    bounded = "minLength" in out or "maxLength" in out
    if (bounded and out.get("type") == "string" and "pattern" not in out and "format" not in out
            and _count(low) and (high is None or _count(high))):
        out.pop("minLength", None)
        out.pop("maxLength", None)
        out["pattern"] = rf'^[^"\\\x00-\x1f]{{{low},{"" if high is None else high}}}$'
    return out


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
