"""kvserve.frontend: the gateway (HTTP, the OpenAI routes, the gRPC client of the backend) and the CLI.

It never imports kvserve.backend, so the loader of its packages' public names is its own."""
from __future__ import annotations

import importlib
from typing import Callable


def exports_loader(package: str, table: dict[str, str]) -> Callable[[str], object]:
    """A package's `__getattr__` (PEP 562) over its table of public names: importing the package loads
    nothing, and a sibling that asks for one name loads only the module that defines it."""
    def load(name: str) -> object:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(table[name], package), name)
    return load
