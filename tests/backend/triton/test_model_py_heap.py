"""model_repository/llm/1/model.py freezes what loading made and hands it back on finalize."""
from __future__ import annotations

import gc
import importlib.util
import sys
import types
from pathlib import Path

import kvserve.backend.triton as triton_pkg

MODEL_PY = Path(__file__).resolve().parents[3] / "model_repository" / "llm" / "1" / "model.py"


class _FakeImpl:
    """Stands in for TritonLLMModel: what it would load is a list of cyclic objects."""

    def __init__(self, pb_utils, args) -> None:
        self.heap = [[] for _ in range(1000)]
        for item in self.heap:
            item.append(item)  # a reference cycle, as an engine and its callbacks make
        self.finalized = False

    def finalize(self) -> None:
        self.finalized = True


def test_initialize_freezes_the_loaded_heap_and_finalize_unfreezes_it(monkeypatch) -> None:
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")  # model.py would set it for the rest of this process
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    monkeypatch.setattr(triton_pkg, "TritonLLMModel", _FakeImpl)
    spec = importlib.util.spec_from_file_location("kvserve_llm_model_py", MODEL_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gc.unfreeze()
    model = module.TritonPythonModel()
    try:
        model.initialize({})
        assert gc.get_freeze_count() >= 1000  # the model's objects are out of the collector's walks
        model.finalize()
        assert model.impl.finalized and gc.get_freeze_count() == 0  # and back in them once it is gone
    finally:
        gc.unfreeze()
