"""Who imports what, read from the source with `ast` (nothing is imported, so a
rule about torch is checked without loading torch)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# kvserve.<package> -> folder, as pyproject.toml maps them.
PACKAGES = {"backend": "backend", "kernels": "kernels", "frontend": "frontend", "observability": "observability",
            "loadtests": "loadtests", "seam": "seam"}


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imports_of(path: Path) -> set[str]:
    """Modules `path` imports anywhere (functions included), except under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: set[str] = set()

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking_block(child):
                for sub in child.orelse:
                    walk(sub)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.add(child.module)
                # `from kvserve.backend import models` may name a submodule.
                found.update(f"{child.module}.{alias.name}" for alias in child.names
                             if module_file(f"{child.module}.{alias.name}") is not None)
            walk(child)

    walk(tree)
    return found


def module_file(module: str) -> Path | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "kvserve" or parts[1] not in PACKAGES:
        return None
    base = ROOT / PACKAGES[parts[1]] / Path(*parts[2:]) if parts[2:] else ROOT / PACKAGES[parts[1]]
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def transitive_imports(path: Path) -> dict[str, Path]:
    """Every module reachable from `path` through kvserve's own modules -> the kvserve file that imports it."""
    seen: dict[str, Path] = {}
    todo = [path]
    visited: set[Path] = set()
    while todo:
        current = todo.pop()
        if current in visited:
            continue
        visited.add(current)
        for module in imports_of(current):
            seen.setdefault(module, current)
            target = module_file(module)
            if target is not None:
                # Importing kvserve.a.b runs kvserve/a/__init__.py first.
                parent = module_file(module.rsplit(".", 1)[0])
                todo.extend(p for p in (target, parent) if p is not None)
    return seen


def python_files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)
