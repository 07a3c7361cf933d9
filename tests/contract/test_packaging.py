"""What pyproject.toml installs: every package folder but loadtests/studies (one-off measurements,
run from a checkout), and nothing installed reaches into studies, or an installed command
(`kvserve bench`, the GPU check from its --target install) would fail on an import."""
from __future__ import annotations

import pytest

from tests.contract.import_graph import PACKAGES, ROOT, python_files, transitive_imports

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
NOT_INSTALLED = ("kvserve.loadtests.studies",)


def _listed() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def _package_folders() -> set[str]:
    found = set()
    for name, folder in PACKAGES.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join(("kvserve", name, *rel.parts)))
    return found


def test_every_package_folder_but_studies_is_installed() -> None:
    folders, listed = _package_folders(), _listed()
    assert folders - listed == set(NOT_INSTALLED), f"not listed in pyproject.toml: {sorted(folders - listed)}"
    assert not listed - folders, f"listed but no such package: {sorted(listed - folders)}"


def _installed_loadtests() -> list:
    return [p for p in python_files("loadtests") if "studies" not in p.relative_to(ROOT).parts]


@pytest.mark.parametrize("path", _installed_loadtests(), ids=lambda p: str(p.relative_to(ROOT / "loadtests")))
def test_installed_loadtests_never_import_the_studies(path) -> None:
    bad = {m: str(via.relative_to(ROOT)) for m, via in transitive_imports(path).items()
           if any(m == s or m.startswith(s + ".") for s in NOT_INSTALLED)}
    assert not bad, f"{path.name} reaches a module that is not installed: {bad}"
