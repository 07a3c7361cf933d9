"""DESIGN.md's import rules, checked on the source: the gateway never imports the
engine, the scheduler and KV manager import no torch, observability and the
seam are leaves."""
from __future__ import annotations

import sys

import pytest

from tests.contract.import_graph import PACKAGES, ROOT, import_cycle, imports_of, python_files, transitive_imports


def _top(module: str) -> str:
    return module.split(".")[0]


@pytest.mark.parametrize("path", python_files("frontend"), ids=lambda p: p.name)
def test_the_gateway_never_imports_the_engine(path) -> None:
    reached = transitive_imports(path)
    bad = {m: str(via.relative_to(ROOT)) for m, via in reached.items()
           if m == "kvserve.backend" or m.startswith("kvserve.backend.") or _top(m) == "torch"}
    assert not bad, f"{path.name} reaches the engine: {bad}"


@pytest.mark.parametrize("path", [ROOT / "backend/engine/scheduler.py", *python_files("backend/kv_cache")],
                         ids=lambda p: p.name)
def test_scheduler_and_kv_manager_import_no_torch(path) -> None:
    reached = transitive_imports(path)
    bad = {m: str(via.relative_to(ROOT)) for m, via in reached.items() if _top(m) in ("torch", "numpy", "triton")}
    assert not bad, f"{path.name} reaches tensors: {bad}"


@pytest.mark.parametrize("path", python_files("observability"), ids=lambda p: p.name)
def test_observability_is_a_leaf(path) -> None:
    bad = {m for m in imports_of(path)
           if _top(m) == "kvserve" and not (m == "kvserve.observability" or m.startswith("kvserve.observability."))}
    assert not bad, f"{path.name} imports {bad}"


# The one seam module with a third-party import: the tokenizer both sides read (a kvserve dependency).
_SEAM_EXTRA = {"tokenizer.py": {"tokenizers"}}


@pytest.mark.parametrize("path", python_files("seam"), ids=lambda p: p.name)
def test_the_seam_is_a_stdlib_leaf(path) -> None:
    """Both sides and model.py inside tritonserver import it: only the standard library and itself
    (and the tokenizer module, which nothing else of the seam imports, `tokenizers`)."""
    allowed = _SEAM_EXTRA.get(path.name, set())
    bad = {m for m in imports_of(path)
           if not (m == "kvserve.seam" or m.startswith("kvserve.seam.") or _top(m) in sys.stdlib_module_names
                   or _top(m) in allowed)}
    assert not bad, f"{path.name} imports {bad}"
    reached = transitive_imports(path)
    if path.name not in _SEAM_EXTRA:
        assert not any(m == f"kvserve.seam.{name[:-3]}" for m in reached for name in _SEAM_EXTRA), \
            f"{path.name} reaches the seam's tokenizer: importing it would need `tokenizers`"


def test_model_py_uses_only_what_tritonserver_provides() -> None:
    path = ROOT / "model_repository/llm/1/model.py"
    allowed = {"os", "triton_python_backend_utils"}
    bad = {m for m in imports_of(path) if m not in allowed and not m.startswith("kvserve.backend")}
    assert not bad, f"model.py imports {bad}"


@pytest.mark.parametrize("folder", sorted(PACKAGES.values()))
def test_no_package_has_an_import_cycle(folder) -> None:
    """A cycle of load-time imports makes import order matter (whichever module is imported first
    sees the other half-initialised); observability had two, through re-exports."""
    cycle = import_cycle(folder)
    assert cycle is None, " -> ".join(cycle or ())
