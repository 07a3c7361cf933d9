"""The built-in default model: `kvserve serve` with no --model serves a tiny
random model so the whole stack runs anywhere (laptop, CI) without downloads.

It is made by the engine's own `kvserve.backend.models.tiny` in a subprocess:
the gateway process never imports the engine (or torch).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEFAULT_MODEL_NAME = "kvserve-tiny"


def default_model_dir() -> Path:
    base = os.environ.get("KVSERVE_CACHE_DIR") or str(Path.home() / ".cache" / "kvserve")
    return Path(base).expanduser() / "tiny-default"


def ensure_default_model(timeout_s: float = 600.0) -> Path:
    """Create the model folder if needed (a no-op when it already holds the model)."""
    target = default_model_dir()
    result = subprocess.run(
        [sys.executable, "-m", "kvserve.backend.models.tiny", str(target)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout_s,
    )
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"could not create the default tiny model in {target}:\n{tail}")
    return target
