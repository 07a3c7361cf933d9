"""Native CPU kernels: C sources in this folder, built once with the system C compiler and loaded with ctypes.

Plain C with OpenMP, no torch headers: a build takes about a second, needs no
ninja or pybind, and the library is cached per source, compiler flags and CPU
(`-march=native`) under ~/.cache/kvserve/cpu-kernels (KVSERVE_CACHE_DIR moves
it). ctypes releases the GIL for the call, so the serving threads run meanwhile.
Without a compiler (or with KVSERVE_CPU_NATIVE=0) `paged_decode` is None and
callers keep their torch path.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger("kvserve.engine")

_SOURCE = Path(__file__).resolve().with_name("cpu_decode_attention.c")
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11"]


def _cache_dir() -> Path:
    base = os.environ.get("KVSERVE_CACHE_DIR") or str(Path.home() / ".cache" / "kvserve")
    return Path(base) / "cpu-kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return os.uname().machine


def _build(compiler: str) -> Path:
    source = _SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join([compiler, *_FLAGS, _cpu_flags()]).encode()).hexdigest()[:16]
    out = _cache_dir() / f"cpu_decode_attention-{digest}.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, *_FLAGS, "-o", tmp, str(_SOURCE), "-lm"], check=True, capture_output=True,
                       timeout=300)
        os.replace(tmp, out)  # atomic: concurrent builders agree on the result
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("KVSERVE_CPU_NATIVE", "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler found: CPU decode attention uses the torch path (gather + SDPA)")
        return None
    try:
        lib = ctypes.CDLL(str(_build(compiler)))
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        log.warning("building the CPU decode attention kernel failed (%s%s): using the torch path",
                    exc, (": " + detail.decode(errors="replace")[-500:]) if detail else "")
        return None
    fn = lib.kvserve_paged_decode_f32
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, p, p, p, i64, p, p, i64, i64, i64, i64, i64, ctypes.c_float, ctypes.c_int]
    fn.restype = ctypes.c_int
    return lib


def available() -> bool:
    return _library() is not None


# The C source's stack-buffer bounds (KVSERVE_MAX_*): larger shapes keep the torch path.
_MAX_HEADS, _MAX_HEAD_DIM, _MAX_BLOCK = 64, 256, 64


def supports(query: torch.Tensor, key_cache: torch.Tensor) -> bool:
    """The kernel's case: float32 CPU tensors, contiguous caches, shapes within its bounds."""
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    return (query.device.type == "cpu" and query.dtype == torch.float32 and key_cache.dtype == torch.float32
            and key_cache.is_contiguous() and query.shape[1] <= _MAX_HEADS
            and head_dim <= _MAX_HEAD_DIM and block_size <= _MAX_BLOCK and available())


def paged_decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """query [B, Hq, D] -> out [B, Hq, D]; same contract as paged_decode_attention_torch (float32 only).

    `block_tables` must be int32 with contiguous rows and `seq_lens` int32 contiguous,
    each length >= 1 (the caller prepares them once per step)."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the native CPU decode attention kernel is not available")
    batch, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    if not (value_cache.shape == key_cache.shape and value_cache.is_contiguous() and key_cache.is_contiguous()):
        raise ValueError("key and value caches must be contiguous [num_blocks, block_size, num_kv_heads, head_dim]")
    if num_heads % num_kv_heads or block_tables.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise ValueError("need num_heads % num_kv_heads == 0 and int32 block tables and lengths")
    if block_tables.stride(1) != 1 or not seq_lens.is_contiguous() or block_tables.shape[0] != batch:
        raise ValueError("block tables need contiguous rows, one per query row")
    query = query.contiguous()
    out = torch.empty_like(query)
    status = lib.kvserve_paged_decode_f32(
        query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), block_tables.data_ptr(),
        block_tables.stride(0), seq_lens.data_ptr(), out.data_ptr(), batch, num_heads, num_kv_heads, head_dim,
        block_size, float(scale), torch.get_num_threads())
    if status:
        raise ValueError(f"CPU decode attention: shapes beyond the kernel's bounds ({num_heads} heads, "
                         f"head size {head_dim}, block size {block_size}); check supports() first")
    return out
