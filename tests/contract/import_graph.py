"""Who imports what, read from the source with `ast` (nothing is imported, so a
rule about torch is checked without loading torch)."""
from __future__ import annotations

import ast
import functools
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
                found.update(_exported_modules(child.module, (alias.name for alias in child.names)))
            walk(child)

    walk(tree)
    return found


@functools.lru_cache(maxsize=None)
def exports_of(init: Path) -> dict[str, str]:
    """A package's public names -> the module that defines each: its `_EXPORTS` table (loaded lazily,
    PEP 562), or for a package that imports eagerly, `__all__` -> the package itself."""
    package = module_of(init)
    tree = ast.parse(init.read_text(encoding="utf-8"), str(init))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
            table = ast.literal_eval(node.value)
            return {name: package + target if target.startswith(".") else target for name, target in table.items()}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {name: package for name in ast.literal_eval(node.value)}
    return {}


def _exported_modules(module: str, names) -> set[str]:
    """`from PACKAGE import NAME` loads the module behind NAME when PACKAGE exports it lazily."""
    init = module_file(module)
    if init is None or init.name != "__init__.py":
        return set()
    table = exports_of(init)
    return {table[name] for name in names if name in table and table[name] != module}


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


def module_of(path: Path) -> str:
    """`ROOT/observability/tracing.py` -> `kvserve.observability.tracing`."""
    rel = path.relative_to(ROOT)
    folder = next(name for name, f in PACKAGES.items() if rel.parts[0] == f)
    parts = [p for p in rel.with_suffix("").parts[1:] if p != "__init__"]
    return ".".join(("kvserve", folder, *parts))


def package_of(path: Path) -> list[str]:
    """The package a file's relative imports start from, as name parts."""
    here = module_of(path).split(".")
    return here if path.name == "__init__.py" else here[:-1]


def resolve_from(package: list[str], node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names (`from ..x import y` in kvserve.a.b -> kvserve.a.x)."""
    base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
    return ".".join(p for p in (base, node.module or "") if p)


def load_time_imports(path: Path) -> set[str]:
    """kvserve modules `path` imports while it loads (module level, relative imports resolved):
    imports inside functions run later and cannot make a cycle of import order."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    here = module_of(path).split(".")
    package = package_of(path)
    found: set[str] = set()

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or _type_checking_block(child):
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                module = resolve_from(package, child)
                found.add(module)
                found.update(f"{module}.{alias.name}" for alias in child.names
                             if module_file(f"{module}.{alias.name}") is not None)
                found.update(_exported_modules(module, (alias.name for alias in child.names)))
            walk(child)

    walk(tree)
    # A package is always loaded before its modules: naming it (`from . import x`) is no cycle.
    ancestors = {".".join(here[:i]) for i in range(1, len(here) + 1)}
    return {m for m in found if module_file(m) is not None and m not in ancestors}


def import_cycle(folder: str) -> list[str] | None:
    """One cycle of load-time imports among the modules under `folder`, or None."""
    graph = {module_of(p): load_time_imports(p) for p in python_files(folder)}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target in graph and not state.get(target):
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if not state.get(module):
            found = visit(module)
            if found:
                return found
    return None
