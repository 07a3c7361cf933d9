"""The embedded Triton-compatible host (see DESIGN.md, "The embedded host").

It loads a Triton model repository of Python-backend models and serves it over
KServe v2 gRPC like tritonserver, so an unmodified model.py runs here. It knows
nothing about LLMs. Entry points: `start_host()` for programs and tests,
`kvserve.backend.host.server:main` for the command line.
"""
from __future__ import annotations

from .host import HostHandle, start_host

__all__ = ["HostHandle", "start_host"]
