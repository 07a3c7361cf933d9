"""Times every engine step inside a served kvserve, for served_step.py (a study's hook, not installed).

Python imports `sitecustomize` from the path at start-up, so putting this folder on the PYTHONPATH
of `kvserve serve` reaches the embedded host child too, with no change to the code measured. When
KVSERVE_STUDY_STEP_LOG names a file, a thread waits for the engine and kernel modules to be imported,
then wraps `LLMEngine.step` and the kernels of a step (`step_timers.install`); every step appends
one line to the file. The gateway process imports neither module: its thread gives up after a while.
"""
from __future__ import annotations

import os
import sys
import threading
import time

_LOG = os.environ.get("KVSERVE_STUDY_STEP_LOG")
_ENGINE_MODULE = "kvserve.backend.engine.engine"
_KERNEL_MODULE = "kvserve.kernels.cpu_native"
_GIVE_UP_S = 900.0


def _wait_and_install(path: str) -> None:
    deadline = time.monotonic() + _GIVE_UP_S
    while time.monotonic() < deadline:
        engine, kernels = sys.modules.get(_ENGINE_MODULE), sys.modules.get(_KERNEL_MODULE)
        # A module is in sys.modules from the start of its import: wait for the names that install() wraps.
        if hasattr(engine, "LLMEngine") and kernels is not None:
            from step_timers import LOGITS_KERNELS, install  # only here, in the host: it imports the studies
            if all(hasattr(kernels, name) for name in ("decode_step", *LOGITS_KERNELS)):
                # A step started before the wrap is not logged; the study's warm-up request covers that.
                install(engine.LLMEngine, kernels, path)
                return
        time.sleep(0.2)


if _LOG:  # this folder is on the PYTHONPATH, so step_timers imports as a top-level module
    threading.Thread(target=_wait_and_install, args=(_LOG,), name="study-step-hook", daemon=True).start()
