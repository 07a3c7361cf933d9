"""pytest plugin for the GPU check's engine stage (`-p kvserve.loadtests.gpu.gpu_engine_plugin`).

On CUDA an engine sizes its KV cache from --gpu-memory-utilization, 0.9 of the device, and
refuses to start when less is free. The engine tests (speculative decoding, KV cache dtypes,
LoRA) were written for the CPU and build engines without a cache size, several alive at once
and in four pytest-xdist workers side by side: here each engine built without one gets
tests/conftest.py's fixed cache instead. Tests that size their cache keep their own."""
from __future__ import annotations


def pytest_configure(config) -> None:
    import torch

    if not torch.cuda.is_available():
        return
    from kvserve.backend.engine import llm

    built = llm.LLM.__init__

    def with_fixed_cache(self, model, **engine_args):
        from tests.conftest import GPU_ENGINE_ARGS  # importable once the tests are collected

        for name, value in GPU_ENGINE_ARGS.items():
            engine_args.setdefault(name, value)
        built(self, model, **engine_args)

    llm.LLM.__init__ = with_fixed_cache
