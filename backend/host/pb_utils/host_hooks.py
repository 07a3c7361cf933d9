"""The few pb_utils functions that need to ask the host something.

In Triton each model runs in its own stub process, so module-level functions
like get_model_dir() know "their" model. Here every model shares one process,
so the host marks each instance thread with its model directory; threads a
model starts itself fall back to the directory of the calling file.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Callable

from .triton_errors import TritonModelException

_local = threading.local()
_model_ready_hook: Callable[[str, str], bool] | None = None


def set_thread_model_dir(path: str | None) -> None:
    _local.model_dir = path


def set_model_ready_hook(hook: Callable[[str, str], bool] | None) -> None:
    global _model_ready_hook
    _model_ready_hook = hook


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
    # tritonserver refuses this outside explicit model-control mode, which the host does not have.
    raise TritonModelException(
        f"failed to load '{model_name}': explicit model load / unload is not allowed "
        "by the kvserve embedded host"
    )


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    raise TritonModelException(
        f"failed to unload '{model_name}': explicit model load / unload is not allowed "
        "by the kvserve embedded host"
    )
