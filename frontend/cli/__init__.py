"""The `kvserve` command line: serve, pull, triton, bench, make-tiny-model, with the engine flags as
vLLM names them, the default model, and the embedded host as a child process."""
from __future__ import annotations

from kvserve.frontend import exports_loader

# Public names -> the module that defines them. Sibling packages import only these names
# (tests/contract/test_import_rules.py), and each loads on first use.
_EXPORTS = {
    "main": ".commands",
}
__all__ = sorted(_EXPORTS)
__getattr__ = exports_loader(__name__, _EXPORTS)
