"""DESIGN.md's import rules, checked on the source: the gateway never imports the
engine, the scheduler and KV manager import no torch, observability and the
seam are leaves."""
from __future__ import annotations

import ast
import sys

import pytest

from tests.contract.import_graph import (PACKAGES, ROOT, exports_of, import_cycle, imports_of, module_file, package_of,
                                         python_files, resolve_from, transitive_imports)


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


# The rooms of backend/ and frontend/ (DESIGN.md's layout) meet only at the names each one's __init__
# exports, so a module can move inside its package without its neighbours noticing. Nested packages
# (host/pb_utils, host/kserve, backend_client/replicas) belong to their parent, which may reach in.
# A documented exception is (importing file, module it imports); none are needed today.
SIBLING_EXCEPTIONS: frozenset[tuple[str, str]] = frozenset()


def _subpackage(top: str, module: str) -> str | None:
    """kvserve.backend.engine.scheduler -> "engine" (a subpackage folder of backend/), else None."""
    parts = module.split(".")
    if parts[:2] != ["kvserve", top] or len(parts) < 3:
        return None
    return parts[2] if (ROOT / top / parts[2] / "__init__.py").is_file() else None


def _sibling_violations(path) -> list[str]:
    rel = path.relative_to(ROOT)
    top, own = rel.parts[0], (rel.parts[1] if len(rel.parts) > 2 else None)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = package_of(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            targets = [(resolve_from(package, node), [alias.name for alias in node.names])]
        else:
            continue
        for module, names in targets:
            sub = _subpackage(top, module)
            if sub is None or sub == own or (str(rel), module) in SIBLING_EXCEPTIONS:
                continue
            package_name = f"kvserve.{top}.{sub}"
            exported = exports_of(ROOT / top / sub / "__init__.py")
            if module != package_name or names is None:
                found.append(f"line {node.lineno}: {module} (import from {package_name} instead)")
            else:
                found += [f"line {node.lineno}: {name} is not exported by {package_name}"
                          for name in names if name not in exported]
    return found


@pytest.mark.parametrize("path", [*python_files("backend"), *python_files("frontend")],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_siblings_import_only_exported_names(path) -> None:
    bad = _sibling_violations(path)
    assert not bad, f"{path.relative_to(ROOT)} reaches into a sibling package: {bad}"


def _export_tables() -> list:
    return [pytest.param(init, id=str(init.parent.relative_to(ROOT)))
            for folder in ("backend", "frontend") for init in sorted((ROOT / folder).glob("*/__init__.py"))]


def _defines(path, name: str) -> bool:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
            return True
    return False


@pytest.mark.parametrize("init", _export_tables())
def test_each_export_names_a_definition_and_no_submodule(init) -> None:
    """An exported name that is also a submodule's name would be shadowed by the submodule once that
    is imported (the import system sets the package attribute), so `from pkg import name` would
    return a module; and each name must be defined where the table says."""
    for name, module in exports_of(init).items():
        assert not (init.parent / f"{name}.py").exists() and not (init.parent / name / "__init__.py").exists(), \
            f"{name} is both an export and a submodule of {init.parent.name}"
        target = module_file(module)
        assert target is not None, f"{name} -> {module}: no such module"
        assert target == init or _defines(target, name), f"{name} is not defined in {module}"
