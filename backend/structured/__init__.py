"""Structured outputs: what a constraint is (spec), how it is compiled (compiler,
off the engine thread, cached) and how it steers decoding (matchers, owned by the engine)."""
from __future__ import annotations

from kvserve.backend import exports_loader

# Public names -> the module that defines them. Sibling packages import only these names
# (tests/contract/test_import_rules.py), and each loads on first use.
_EXPORTS = {
    "CompileJob": ".compiler",
    "GrammarCompiler": ".compiler",
    "GrammarMatchers": ".matchers",
    "GrammarSpec": ".spec",
    "parse_spec": ".spec",
}
__all__ = sorted(_EXPORTS)
__getattr__ = exports_loader(__name__, _EXPORTS)
