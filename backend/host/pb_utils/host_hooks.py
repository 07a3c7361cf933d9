"""The few pb_utils functions that need to ask the host something.

In Triton each model runs in its own stub process, so module-level functions
like get_model_dir() know "their" model. Here every model shares one process,
so the host marks each instance thread with its model's name and directory;
threads a model starts itself fall back to the directory of the calling file.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Callable, Protocol

from .triton_errors import TritonModelException

_local = threading.local()
_model_ready_hook: Callable[[str, str], bool] | None = None


class ModelControl(Protocol):
    """What the host lends load_model() and unload_model(); both raise TritonModelException."""

    def load(self, model_name: str) -> None: ...

    def unload(self, model_name: str) -> None: ...


_model_control: ModelControl | None = None


def set_thread_model(name: str, model_dir: str) -> None:
    _local.model_name = name
    _local.model_dir = model_dir


def set_model_ready_hook(hook: Callable[[str, str], bool] | None) -> None:
    global _model_ready_hook
    _model_ready_hook = hook


def set_model_control(control: ModelControl | None) -> None:
    global _model_control
    _model_control = control


def get_model_dir() -> str:
    path = getattr(_local, "model_dir", None)
    if path:
        return path
    return os.path.dirname(os.path.abspath(sys._getframe(1).f_code.co_filename))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    if _model_ready_hook is None:
        return False
    return _model_ready_hook(model_name, model_version)


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) another model of the repository and return once it serves, as the
    Python backend's BLS model-loading API does; explicit model control only."""
    if config or files:
        # tritonserver's override; refused rather than ignored, as the gRPC RPC refuses it
        raise TritonModelException(f"failed to load '{model_name}': a config or files sent with the load "
                                   "are not supported by the kvserve embedded host")
    _control("load", model_name).load(model_name)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Start unloading another model and return, as TRITONSERVER_ServerUnloadModel does (the model
    takes no new requests from then on; it finalizes once those it holds are done). The host has
    no ensembles, so `unload_dependents` has nothing to act on."""
    _control("unload", model_name).unload(model_name)


def _control(action: str, model_name: str) -> ModelControl:
    if _model_control is None:
        # no host serving (the start-up loads, or the host stopping): the Python backend
        # documents the API as usable while the server runs
        raise TritonModelException(f"failed to {action} '{model_name}': model control is available only "
                                   "while the server runs")
    if getattr(_local, "model_name", None) == model_name:
        # its own load or unload would wait on the very thread that asks (its execute holds it)
        raise TritonModelException(f"failed to {action} '{model_name}': a model cannot {action} itself")
    return _model_control
