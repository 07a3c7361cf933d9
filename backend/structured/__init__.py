"""Structured outputs: what a constraint is (spec), how it is compiled (compiler,
off the engine thread, cached) and how it steers decoding (matchers, owned by the engine)."""
from __future__ import annotations

import importlib

# Public names -> the module that defines them, imported on first use (PEP 562). Sibling packages
# import only these names (tests/contract/test_import_rules.py), and nothing loads before it is used.
_EXPORTS = {
    "CompileJob": ".compiler",
    "GrammarCompiler": ".compiler",
    "GrammarMatchers": ".matchers",
    "GrammarSpec": ".spec",
    "parse_spec": ".spec",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
