"""DESIGN.md's layout, checked on the tree: package roots stay small enough to read, a file's name
says which one it is, and the tests mirror the packages they test."""
from __future__ import annotations

from collections import defaultdict

import pytest

from tests.contract.import_graph import PACKAGES, ROOT, python_files

# DESIGN.md: "a package root holds ~15 modules at most" (__init__ and __main__ not counted).
MAX_MODULES = 16
_ENTRY_FILES = {"__init__.py", "__main__.py"}


def _packages() -> list:
    return sorted({p.parent for folder in PACKAGES.values() for p in python_files(folder) if p.name == "__init__.py"})


@pytest.mark.parametrize("package", _packages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_package_root_holds_more_than_about_15_modules(package) -> None:
    modules = sorted(p.name for p in package.glob("*.py") if p.name not in _ENTRY_FILES)
    assert len(modules) <= MAX_MODULES, f"{package.relative_to(ROOT)} holds {len(modules)} modules: {modules}"


def test_no_source_file_name_repeats_across_packages() -> None:
    """`request.py` should say which request: a name found in two packages makes every traceback,
    grep and review ask which one."""
    where = defaultdict(list)
    for folder in PACKAGES.values():
        for path in python_files(folder):
            if path.name not in _ENTRY_FILES:
                where[path.name].append(str(path.relative_to(ROOT)))
    repeated = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not repeated, repeated


@pytest.mark.parametrize("folder", ["backend", "frontend"])
def test_the_tests_mirror_the_subpackages(folder) -> None:
    """tests/backend/<room>/ and tests/frontend/<room>/ for each room that has tests of its own."""
    rooms = {p.parent.name for p in (ROOT / folder).glob("*/__init__.py")}
    test_rooms = {p.name for p in (ROOT / "tests" / folder).iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert test_rooms <= rooms, f"tests/{folder} has folders for no package: {sorted(test_rooms - rooms)}"
    loose = sorted(p.name for p in (ROOT / "tests" / folder).glob("test_*.py"))
    assert not loose, f"tests/{folder}/ holds tests outside any package folder: {loose}"
