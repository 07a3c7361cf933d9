"""The llm model freezes what loading made (out of Python's full collections) and hands it back on
finalize, loaded in-process by the embedded host's repository as tritonserver's stub would."""
from __future__ import annotations

import gc
from pathlib import Path

from kvserve.backend.host.host_metrics import HostMetrics
from kvserve.backend.host.model_runtime import ModelState
from kvserve.backend.host.repository import ModelRepository
from tests.conftest import tiny_model

MODEL_REPOSITORY = Path(__file__).resolve().parents[3] / "model_repository"


def test_loading_freezes_the_heap_and_finalize_unfreezes_it(monkeypatch) -> None:
    monkeypatch.setenv("KVSERVE_MODEL", tiny_model("llama"))
    monkeypatch.setenv("KVSERVE_MAX_MODEL_LEN", "128")
    monkeypatch.setenv("KVSERVE_NUM_KV_BLOCKS", "64")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    gc.unfreeze()
    repo = ModelRepository(MODEL_REPOSITORY, HostMetrics())
    repo.scan(only=frozenset({"llm"}))
    try:
        repo.load_all()
        assert repo.lookup("llm").state == ModelState.READY
        # the engine, its model and tokenizer: tens of thousands of objects the collector no longer walks
        assert gc.get_freeze_count() > 10_000
    finally:
        repo.shutdown()
        frozen_after = gc.get_freeze_count()
        gc.unfreeze()
    assert frozen_after == 0  # finalize handed them back: a model's reference cycles can be collected
