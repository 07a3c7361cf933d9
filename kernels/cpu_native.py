"""Native CPU kernels: C sources in this folder, built once with the system C compiler and loaded with ctypes.

Plain C with OpenMP, no torch headers: a build takes about a second, needs no
ninja or pybind, and the library is cached per source, compiler flags and CPU
(`-march=native`) under ~/.cache/kvserve/cpu-kernels (KVSERVE_CACHE_DIR moves
it). ctypes releases the GIL for the call, so the serving threads run meanwhile.
Without a compiler (or with KVSERVE_CPU_NATIVE=0) `available()` is False and
callers keep their torch path.

- cpu_decode_attention.c: paged decode attention reading the KV cache in place (float32, bfloat16 or
  fp8 caches, widened as they are loaded);
- cpu_elementwise.c: RMSNorm (with its residual add), SiLU-and-mul and the
  rotary embedding in one pass each;
- cpu_sampling.c: one token per row of filtered logits by inverting its CDF, and the greedy token of each row;
- cpu_linear.c: linear layers over float32 weights or int8/int4 codes packed once;
- cpu_grid_linear.c: few-row linear layers over float32 weights kept as the codes of
  their block grid (backend/models/grid_weights.py);
- cpu_lora.c: the batched LoRA shrink/expand of a step's rows grouped by adapter slot
  (kernels/lora_sgmv.py has the torch reference);
- cpu_kv_write.c: float32 keys and values converted to a cache format as kv_quant.py's `quantize` does;
- cpu_decode_step.c: a Llama-family or Gemma 3 decoder stack for one decode step over the kernels above, in one call
  (backend/worker/native_decode.py drives it).
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
from typing import NamedTuple

import torch

from kvserve.kernels.kv_quant import fp8_values

log = logging.getLogger("kvserve.engine")

_SOURCES = [Path(__file__).resolve().with_name(name)
            for name in ("cpu_decode_attention.c", "cpu_elementwise.c", "cpu_sampling.c", "cpu_linear.c",
                         "cpu_grid_linear.c", "cpu_grid_int8_dot.c", "cpu_lora.c", "cpu_kv_write.c",
                         "cpu_decode_step.c")]
_HEADERS = [Path(__file__).resolve().with_name(name) for name in ("cpu_exp.h", "cpu_vec16.h")]  # part of the cache key, not compiled alone
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
    source = b"".join(path.read_bytes() for path in (*_SOURCES, *_HEADERS))
    digest = hashlib.sha256(source + " ".join([compiler, *_FLAGS, _cpu_flags()]).encode()).hexdigest()[:16]
    out = _cache_dir() / f"kvserve_cpu_kernels-{digest}.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, *_FLAGS, "-o", tmp, *map(str, _SOURCES), "-lm"], check=True, capture_output=True,
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
        log.warning("no C compiler found: the CPU path's attention, norms and activations use torch ops")
        return None
    try:
        lib = ctypes.CDLL(str(_build(compiler)))
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        log.warning("building the native CPU kernels failed (%s%s): using torch ops",
                    exc, (": " + detail.decode(errors="replace")[-500:]) if detail else "")
        return None
    fn = lib.kvserve_paged_decode
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, p, p, ctypes.c_int, p, p, i64, p, p, i64, i64, i64, i64, i64, i64, ctypes.c_float, ctypes.c_int]
    fn.restype = ctypes.c_int
    lib.kvserve_kv_to_f32.argtypes = [p, ctypes.c_int, p, i64, p]
    lib.kvserve_kv_to_f32.restype = None
    lib.kvserve_rms_norm_f32.argtypes = [p, p, p, p, p, i64, i64, i64, i64, ctypes.c_float, ctypes.c_int]
    lib.kvserve_rms_norm_f32.restype = None
    for gated in (lib.kvserve_silu_and_mul_f32, lib.kvserve_gelu_tanh_and_mul_f32):
        gated.argtypes = [p, p, i64, i64, i64, ctypes.c_int]
        gated.restype = None
    lib.kvserve_rotary_f32.argtypes = [p, i64, i64, i64, i64, p, p, i64, ctypes.c_int, ctypes.c_int]
    lib.kvserve_rotary_f32.restype = None
    lib.kvserve_sample_rows_f32.argtypes = [p, i64, i64, i64, p, p, ctypes.c_int]
    lib.kvserve_sample_rows_f32.restype = ctypes.c_int
    lib.kvserve_argmax_rows_f32.argtypes = [p, i64, i64, i64, p, ctypes.c_int]
    lib.kvserve_argmax_rows_f32.restype = None
    lib.kvserve_pack_linear_f32.argtypes = [p, i64, i64, p]
    lib.kvserve_pack_linear_f32.restype = None
    lib.kvserve_linear_f32.argtypes = [p, i64, i64, i64, p, i64, p, p, i64, ctypes.c_int]
    lib.kvserve_linear_f32.restype = ctypes.c_int
    lib.kvserve_pack_linear_i8.argtypes = [p, i64, i64, p]
    lib.kvserve_pack_linear_i8.restype = None
    lib.kvserve_linear_i8_f32.argtypes = [p, i64, i64, i64, p, p, i64, p, p, i64, ctypes.c_int]
    lib.kvserve_linear_i8_f32.restype = ctypes.c_int
    lib.kvserve_pack_linear_i4.argtypes = [p, i64, i64, p]
    lib.kvserve_pack_linear_i4.restype = None
    lib.kvserve_linear_grouped_f32.argtypes = [p, i64, i64, i64, p, ctypes.c_int, p, p, i64, p, p, i64, ctypes.c_int]
    lib.kvserve_linear_grouped_f32.restype = ctypes.c_int
    lib.kvserve_grid_linear_f32.argtypes = [p, i64, i64, i64, p, ctypes.c_int, i64, p, p, i64, ctypes.c_int]
    lib.kvserve_grid_linear_f32.restype = ctypes.c_int
    lib.kvserve_grid_rows_f32.argtypes = [p, ctypes.c_int, i64, i64, p, i64, p]
    lib.kvserve_grid_rows_f32.restype = ctypes.c_int
    lib.kvserve_grid_int8_dot_available.argtypes = []
    lib.kvserve_grid_int8_dot_available.restype = ctypes.c_int
    lib.kvserve_grid_strip_rows.argtypes = []
    lib.kvserve_grid_strip_rows.restype = ctypes.c_int
    lib.kvserve_lora_f32.argtypes = [p, i64, i64, p, p, i64, i64, p, p, p, p, p, i64, p, i64, i64, p, ctypes.c_int]
    lib.kvserve_lora_f32.restype = ctypes.c_int
    lib.kvserve_kv_from_f32.argtypes = [p, i64, ctypes.c_int, p]
    lib.kvserve_kv_from_f32.restype = None
    lib.kvserve_decode_step_f32.argtypes = [p, p, i64, p, p, p]
    lib.kvserve_decode_step_f32.restype = ctypes.c_int
    return lib


def available() -> bool:
    return _library() is not None


# The C source's stack-buffer bounds (KVSERVE_MAX_*): larger shapes keep the torch path.
MAX_HEADS, MAX_HEAD_DIM, MAX_BLOCK = 64, 256, 64

# The cache dtypes the decode kernel reads, as its KVSERVE_KV_* format codes.
_KV_FORMATS = {torch.float32: 0, torch.bfloat16: 1, torch.float8_e4m3fn: 2, torch.float8_e5m2: 3}


@functools.cache
def _fp8_table(dtype: torch.dtype) -> torch.Tensor:
    """An fp8 format's 256 values for the kernel's scalar loops (kept alive: the kernel reads its memory)."""
    return fp8_values(dtype).contiguous()


def _kv_values(dtype: torch.dtype) -> int | None:
    return _fp8_table(dtype).data_ptr() if _KV_FORMATS[dtype] >= 2 else None


def supports(query: torch.Tensor, key_cache: torch.Tensor) -> bool:
    """The kernel's case: float32 CPU queries, contiguous caches of a format it reads, shapes within its bounds."""
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    return (query.device.type == "cpu" and query.dtype == torch.float32 and key_cache.dtype in _KV_FORMATS
            and key_cache.is_contiguous() and query.shape[1] <= MAX_HEADS
            and head_dim <= MAX_HEAD_DIM and block_size <= MAX_BLOCK and available())


def paged_decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                 window: int | None = None) -> torch.Tensor:
    """query [B, Hq, D] -> out [B, Hq, D]; same contract as paged_decode_attention_torch.

    float32 queries; the caches float32, bfloat16, float8_e4m3fn or float8_e5m2 (the fp8 ones with a
    scale of 1.0: kernels/kv_quant.py), both of one dtype.

    With a `window`, each query sees its context's last `window` positions: the kernel starts
    there, so the table entries of the blocks before them are never read (a sliding KV cache
    group's released blocks: stale ids or the null block).

    `block_tables` must be int32 with contiguous rows and `seq_lens` int32 contiguous,
    each length >= 1 (the caller prepares them once per step)."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the native CPU decode attention kernel is not available")
    batch, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    if not (value_cache.shape == key_cache.shape and value_cache.is_contiguous() and key_cache.is_contiguous()):
        raise ValueError("key and value caches must be contiguous [num_blocks, block_size, num_kv_heads, head_dim]")
    if key_cache.dtype not in _KV_FORMATS or value_cache.dtype != key_cache.dtype or query.dtype != torch.float32:
        raise ValueError(f"CPU decode attention reads float32 queries and caches of one of {list(_KV_FORMATS)}, "
                         f"got {query.dtype} and {key_cache.dtype}/{value_cache.dtype}")
    if num_heads % num_kv_heads or block_tables.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise ValueError("need num_heads % num_kv_heads == 0 and int32 block tables and lengths")
    if block_tables.stride(1) != 1 or not seq_lens.is_contiguous() or block_tables.shape[0] != batch:
        raise ValueError("block tables need contiguous rows, one per query row")
    query = query.contiguous()
    out = torch.empty_like(query)
    status = lib.kvserve_paged_decode(
        query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), _KV_FORMATS[key_cache.dtype],
        _kv_values(key_cache.dtype), block_tables.data_ptr(),
        block_tables.stride(0), seq_lens.data_ptr(), out.data_ptr(), batch, num_heads, num_kv_heads, head_dim,
        block_size, window or 0, float(scale), torch.get_num_threads())
    if status:
        raise ValueError(f"CPU decode attention: shapes beyond the kernel's bounds ({num_heads} heads, "
                         f"head size {head_dim}, block size {block_size}); check supports() first")
    return out


def kv_format(dtype: torch.dtype) -> int | None:
    """The C kernels' code of a cache dtype (KVSERVE_KV_*), None for one they do not read."""
    return _KV_FORMATS.get(dtype)


def kv_values(dtype: torch.dtype) -> int | None:
    """The address of an fp8 format's 256 values (the decode kernel's table; None for the others)."""
    return _kv_values(dtype)


def kv_from_f32(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D float32 tensor in a cache format as the native decode step writes it: for the tests,
    which hold it to kv_quant.quantize bit for bit."""
    lib = _library()
    if lib is None or values.dim() != 1 or values.dtype != torch.float32 or dtype not in _KV_FORMATS:
        raise ValueError("kv_from_f32 takes a 1-D float32 tensor and a cache dtype the kernels read")
    values = values.contiguous()
    out = torch.empty(values.shape[0], dtype=dtype)
    lib.kvserve_kv_from_f32(values.data_ptr(), values.shape[0], _KV_FORMATS[dtype], out.data_ptr())
    return out


def kv_to_f32(values: torch.Tensor) -> torch.Tensor:
    """A 1-D cache-format tensor widened to float32 as the decode kernel widens it (16 at a time by its
    vector loads (AVX-512, or AVX2 + F16C) where the CPU has them, the rest by its scalar loops): for the tests."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the native CPU kernels are not available")
    if values.dim() != 1 or values.dtype not in _KV_FORMATS or not values.is_contiguous():
        raise ValueError(f"kv_to_f32 takes a contiguous 1-D tensor of one of {list(_KV_FORMATS)}")
    out = torch.empty(values.shape[0], dtype=torch.float32)
    lib.kvserve_kv_to_f32(values.data_ptr(), _KV_FORMATS[values.dtype], _kv_values(values.dtype), values.shape[0],
                          out.data_ptr())
    return out


# Below this many elements an elementwise op stays on the calling thread: an OpenMP region's
# start and barrier cost more than the work (decode steps: a few rows of the hidden size).
PARALLEL_MIN_ELEMENTS = 1 << 16


def _threads(elements: int) -> int:
    return torch.get_num_threads() if elements >= PARALLEL_MIN_ELEMENTS else 1


def _rows_ok(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """`rms_norm_torch`'s contract for float32 CPU rows (2-D, unit column stride), else None:
    norm(x), or (norm(x + residual), x + residual)."""
    lib = _library()
    if (lib is None or not _rows_ok(x) or weight.dtype != torch.float32 or not weight.is_contiguous()
            or weight.shape != x.shape[1:] or (residual is not None and (not _rows_ok(residual)
                                                                          or residual.shape != x.shape))):
        return None
    rows, n = x.shape
    out = torch.empty(rows, n)
    residual_out = None if residual is None else torch.empty(rows, n)
    lib.kvserve_rms_norm_f32(x.data_ptr(), 0 if residual is None else residual.data_ptr(), weight.data_ptr(),
                             out.data_ptr(), 0 if residual_out is None else residual_out.data_ptr(), rows, n,
                             x.stride(0), 0 if residual is None else residual.stride(0), float(eps),
                             _threads(rows * n))
    return out if residual is None else (out, residual_out)


def _gated_and_mul(x: torch.Tensor, kernel: str) -> torch.Tensor | None:
    lib = _library()
    if lib is None or not _rows_ok(x) or x.shape[1] % 2:
        return None
    rows, d = x.shape[0], x.shape[1] // 2
    out = torch.empty(rows, d)
    getattr(lib, kernel)(x.data_ptr(), out.data_ptr(), rows, d, x.stride(0), _threads(rows * d))
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor | None:
    """`silu_and_mul_torch` for float32 CPU rows [T, 2d] (unit column stride), else None."""
    return _gated_and_mul(x, "kvserve_silu_and_mul_f32")


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor | None:
    """gelu(x[:, :d], approximate="tanh") * x[:, d:] for float32 CPU rows [T, 2d] (unit column
    stride), else None."""
    return _gated_and_mul(x, "kvserve_gelu_tanh_and_mul_f32")


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> bool:
    """`rotate_torch` on one float32 CPU tensor x [T, H, D] (unit stride within a head), in place,
    with cos/sin [T, rotary_dim / 2] contiguous; False (x untouched) where it does not apply."""
    lib = _library()
    half = cos.shape[-1] if cos.dim() == 2 else -1
    if (lib is None or x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 3 or x.stride(2) != 1
            or cos.dtype != torch.float32 or sin.dtype != torch.float32 or not cos.is_contiguous()
            or not sin.is_contiguous() or cos.shape != (x.shape[0], half) or sin.shape != cos.shape
            or 2 * half > x.shape[2]):
        return False
    rows, heads, _ = x.shape
    lib.kvserve_rotary_f32(x.data_ptr(), rows, heads, x.stride(0), x.stride(1), cos.data_ptr(), sin.data_ptr(),
                           half, int(is_neox), _threads(rows * heads * 2 * half))
    return True


def sample_rows(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor | None:
    """One token id per row of temperature-scaled, filtered float32 CPU logits [B, V] (-inf: never
    drawn), inverting each row's CDF at `uniforms` (float64 [B], in [0, 1)); -1 for a row with no
    finite mass. None when the library (or this shape) is not served: the caller's torch path runs."""
    lib = _library()
    if lib is None or not _rows_ok(logits) or uniforms.dtype != torch.float64 or not uniforms.is_contiguous():
        return None
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64)
    if lib.kvserve_sample_rows_f32(logits.data_ptr(), logits.stride(0), rows, vocab, uniforms.data_ptr(),
                                   out.data_ptr(), _threads(rows * vocab)):
        return None
    return out


def argmax_rows(logits: torch.Tensor) -> torch.Tensor | None:
    """`logits.argmax(dim=-1)` for float32 CPU rows [B, V] (unit column stride): the first index of
    each row's largest value (of its first NaN, if any), int64 [B]. None where it does not apply."""
    lib = _library()
    if lib is None or not _rows_ok(logits):
        return None
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64)
    lib.kvserve_argmax_rows_f32(logits.data_ptr(), logits.stride(0), rows, vocab, out.data_ptr(),
                                _threads(rows * vocab))
    return out


_LINEAR_TILE = 16  # cpu_linear.c's KVSERVE_LINEAR_TILE
INT4_GROUP = 32  # cpu_linear.c's KVSERVE_LINEAR_I4_GROUP


@functools.cache
def _linear_runs() -> bool:
    """Whether this build's linear kernel runs (it needs AVX-512, or AVX2 + FMA + F16C): one 1x1 product, tried once."""
    lib = _library()
    if lib is None:
        return False
    w, x, out = torch.ones(_LINEAR_TILE), torch.ones(1), torch.empty(1)
    return lib.kvserve_linear_f32(x.data_ptr(), 1, 1, 1, w.data_ptr(), 1, None, out.data_ptr(), 1, 1) == 0


def decode_step(shape, layers, num_layers: int, x: int, x_out: int, residual_out: int) -> int:
    """kvserve_decode_step_f32 over ctypes structs (backend/worker/native_decode.py builds them);
    nonzero where a kernel declined."""
    return _library().kvserve_decode_step_f32(shape, layers, num_layers, x, x_out, residual_out)


def linear_available() -> bool:
    """Whether the native linear kernels run here (a C compiler, and AVX-512 or AVX2 + FMA + F16C)."""
    return _linear_runs()


def int8_dot_available() -> bool:
    """Whether int4 strips may multiply with int8-quantized activations here (cpu_grid_int8_dot.c:
    AVX-512 F and BW, or AVX2 + FMA + F16C)."""
    lib = _library()
    return lib is not None and bool(lib.kvserve_grid_int8_dot_available())


@functools.cache
def grid_strip_rows() -> int:
    """The rows up to which `grid_linear_strips` widens each code once (4 under AVX-512, 6 under AVX2),
    past which `linear_grid`'s tiles serve a step faster; 0 where the kernels do not run."""
    lib = _library()
    return int(lib.kvserve_grid_strip_rows()) if lib is not None else 0


def pack_linear(weight: torch.Tensor) -> torch.Tensor | None:
    """A float32 [N, K] weight (or int8 codes) in `linear`'s tiled layout, or None where the kernel
    does not run."""
    if (not _linear_runs() or weight.dtype not in (torch.float32, torch.int8) or weight.dim() != 2
            or weight.device.type != "cpu"):
        return None
    n, k = weight.shape
    weight = weight.detach().contiguous()
    packed = torch.empty((n + _LINEAR_TILE - 1) // _LINEAR_TILE * _LINEAR_TILE * k, dtype=weight.dtype)
    pack = _library().kvserve_pack_linear_f32 if weight.dtype == torch.float32 else _library().kvserve_pack_linear_i8
    pack(weight.data_ptr(), n, k, packed.data_ptr())
    return packed


def linear_rows(packed: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """Rows `ids` (int, any shape) of the float32 weight [N, k] that `pack_linear` packed: the same
    values, gathered from their tiles ([N/16][k][16]; each row is one lane of its tile)."""
    flat = ids.reshape(-1).long()
    rows = packed.view(-1, k, _LINEAR_TILE)[flat // _LINEAR_TILE, :, flat % _LINEAR_TILE]
    return rows.view(*ids.shape, k)


class Int4Weight(NamedTuple):
    """`pack_linear_i4`'s (and `pack_grid_tiles`') result: the codes and the tile-major scales and
    zeros (empty for 8-bit grid codes)."""
    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor


# cpu_linear.c's formats of codes with scales per group of 32 inputs (its W_I4, W_G4, W_G8) and of
# 16 (W_G8H).
_W_I4, _W_G4, _W_G8, _W_G8H = 2, 3, 4, 5
_GRID_TILE_FORMATS = {4: _W_G4, 8: _W_G8, 16: _W_G8H}  # grid_weights.py kind -> cpu_linear.c format
INT4_FORMAT = _W_I4  # for native callers that describe a weight by its format (native_decode.py)


def grid_tile_format(kind: int) -> int:
    """cpu_linear.c's format for the grid tiles of a grid_weights.py kind (4, 8 or 16)."""
    return _GRID_TILE_FORMATS[kind]


def _tile_major(values: torch.Tensor) -> torch.Tensor:
    """Per-output, per-group values [N, G] -> [ceil(N/16)][G][16], zero past N: one vector
    of a tile's 16 outputs per group, as cpu_linear.c reads scales and zeros."""
    n, groups = values.shape
    tiles = (n + _LINEAR_TILE - 1) // _LINEAR_TILE
    padded = torch.zeros(tiles * _LINEAR_TILE, groups)
    padded[:n] = values
    return padded.view(tiles, _LINEAR_TILE, groups).transpose(1, 2).contiguous().reshape(-1)


def pack_linear_i4(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> Int4Weight | None:
    """int4 codes [N, K] (0..15) with one scale and zero per output and group of 32 inputs
    ([N, K / 32] each, w = (q - 8) * scale + zero) in `linear_i4`'s layout; None where the kernel
    does not run or K is not a multiple of 32."""
    if not _linear_runs() or codes.dim() != 2 or codes.shape[1] % INT4_GROUP or codes.device.type != "cpu":
        return None
    n, k = codes.shape
    tiles = (n + _LINEAR_TILE - 1) // _LINEAR_TILE
    codes = codes.detach().to(torch.int32).contiguous()
    packed = torch.empty(tiles * _LINEAR_TILE * k // 2, dtype=torch.uint8)
    _library().kvserve_pack_linear_i4(codes.data_ptr(), n, k, packed.data_ptr())
    scale, zero = (_tile_major(v.detach().float().reshape(n, k // INT4_GROUP)) for v in (scale, zero))
    return Int4Weight(packed, scale, zero)


def _linear_grouped(x: torch.Tensor, weight: Int4Weight, fmt: int, out_features: int,
                    bias: torch.Tensor | None) -> torch.Tensor | None:
    """x [M, K] (float32 rows, unit column stride) times packed codes of cpu_linear.c's format `fmt`
    with tile-major group scales, plus bias; None if the kernel declines."""
    lib = _library()
    if lib is None or not _rows_ok(x):
        return None
    rows, k = x.shape
    tiles = (out_features + _LINEAR_TILE - 1) // _LINEAR_TILE
    groups = tiles * (k // (16 if fmt == _W_G8H else INT4_GROUP)) * _LINEAR_TILE
    code_bytes = tiles * _LINEAR_TILE * k // (1 if fmt in (_W_G8, _W_G8H) else 2)
    if (k % INT4_GROUP or weight.codes.numel() * weight.codes.element_size() != code_bytes
            or weight.scales.numel() != groups or weight.zeros.numel() != (0 if fmt == _W_G8 else groups)
            or (bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()
                                      or bias.numel() != out_features))):
        raise ValueError("native grouped linear: the input width, packed weight and bias do not agree")
    out = torch.empty(rows, out_features)
    status = lib.kvserve_linear_grouped_f32(x.data_ptr(), x.stride(0), rows, k, weight.codes.data_ptr(), fmt,
                                            weight.scales.data_ptr(),
                                            weight.zeros.data_ptr() if weight.zeros.numel() else None, out_features,
                                            None if bias is None else bias.data_ptr(), out.data_ptr(), out_features,
                                            torch.get_num_threads())
    return None if status else out


def linear_i4(x: torch.Tensor, weight: Int4Weight, out_features: int, bias: torch.Tensor | None) -> torch.Tensor | None:
    """x [M, K] (float32 rows, unit column stride) times a `pack_linear_i4` weight, plus bias; None if
    the kernel declines."""
    return _linear_grouped(x, weight, _W_I4, out_features, bias)


def linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None,
           scales: torch.Tensor | None = None) -> torch.Tensor | None:
    """x [M, K] (float32 rows, unit column stride) times a `pack_linear` weight, plus bias; int8 codes
    take float32 `scales` [N], one per output. None if the kernel declines (the caller's other path
    runs)."""
    lib = _library()
    if lib is None or not _rows_ok(x):
        return None
    rows, k = x.shape
    vectors = [v for v in (bias, scales) if v is not None]
    if (packed.numel() != (out_features + _LINEAR_TILE - 1) // _LINEAR_TILE * _LINEAR_TILE * k
            or (scales is None) != (packed.dtype == torch.float32)
            or any(v.dtype != torch.float32 or not v.is_contiguous() or v.numel() != out_features for v in vectors)):
        raise ValueError("native linear: the input width, packed weight, scales and bias do not agree")
    out = torch.empty(rows, out_features)
    bias_ptr = None if bias is None else bias.data_ptr()
    if scales is None:
        status = lib.kvserve_linear_f32(x.data_ptr(), x.stride(0), rows, k, packed.data_ptr(), out_features,
                                        bias_ptr, out.data_ptr(), out_features, torch.get_num_threads())
    else:
        status = lib.kvserve_linear_i8_f32(x.data_ptr(), x.stride(0), rows, k, packed.data_ptr(), scales.data_ptr(),
                                           out_features, bias_ptr, out.data_ptr(), out_features,
                                           torch.get_num_threads())
    return None if status else out


def grid_linear_strips(x: torch.Tensor, packed: torch.Tensor, bits: int, out_features: int,
                       bias: torch.Tensor | None) -> torch.Tensor | None:
    """x [M, K] (float32 rows, unit column stride) times a weight in grid_weights.py's strips of
    kind `bits` (2, 3, 4, 5, 6, 8, 9, 16 or 17: its INT4, INT4_Q8, Q4, Q4_Q8, Q4H_Q8, Q8, Q8_Q8,
    Q8_HALVES, Q8H_Q8), plus bias; None if the kernel declines (neither AVX-512 nor AVX2 + FMA + F16C, or for
    the int8-activation kinds AVX-512 without BW: the caller's other path runs)."""
    lib = _library()
    if lib is None or not _rows_ok(x):
        return None
    rows, k = x.shape
    # cpu_grid_linear.c's and cpu_grid_int8_dot.c's block_bytes()
    block_bytes = {2: 96, 3: 80, 4: 96, 5: 96, 6: 80, 8: 144, 9: 144, 16: 192, 17: 192}.get(bits, 0)
    strips = (out_features + 3) // 4
    if (not block_bytes or k % 32 or packed.dtype != torch.uint8 or packed.numel() != strips * (k // 32) * block_bytes
            or (bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()
                                      or bias.numel() != out_features))):
        raise ValueError("native grid linear: the input width, packed weight and bias do not agree")
    out = torch.empty(rows, out_features)
    status = lib.kvserve_grid_linear_f32(x.data_ptr(), x.stride(0), rows, k, packed.data_ptr(), bits, out_features,
                                         None if bias is None else bias.data_ptr(), out.data_ptr(), out_features,
                                         torch.get_num_threads())
    return None if status else out


def grid_rows(packed: torch.Tensor, bits: int, ids: torch.Tensor, out_features: int, k: int) -> torch.Tensor | None:
    """Rows `ids` (int, any shape) of the float32 weight [out_features, k] held as grid_weights.py's
    strips of kind `bits`: the values the strips' products use. None where the kernel declines (no
    vector path: the caller dequantizes with torch); ValueError for an id outside the table."""
    lib = _library()
    if lib is None:
        return None
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty(flat.numel(), k)
    status = lib.kvserve_grid_rows_f32(packed.data_ptr(), bits, k, out_features, flat.data_ptr(), flat.numel(),
                                       out.data_ptr())
    if status == 4:
        raise ValueError(f"token id outside the vocabulary of {out_features}")
    return None if status else out.view(*ids.shape, k)


def pack_grid_tiles(codes: torch.Tensor, step: torch.Tensor, low: torch.Tensor | None) -> Int4Weight | None:
    """Grid codes [N, K] of float32 weights (backend/models/grid_weights.py) in `linear_grid`'s tiles:
    4-bit ones (uint8 0..15, value q * step + low, both [N, K / 32]) as `pack_linear_i4` lays them,
    8-bit ones (int8, value q * step; `low` None) as `pack_linear` with tile-major steps. None where
    the kernel does not run."""
    if low is not None:
        return pack_linear_i4(codes, step, low)
    packed = pack_linear(codes)
    return None if packed is None else Int4Weight(packed, _tile_major(step.float()), torch.empty(0))


def pack_grid_tiles_halves(codes: torch.Tensor, step: torch.Tensor, offset: torch.Tensor) -> Int4Weight | None:
    """8-bit grid codes [N, K] (int8) whose value is q * step + offset, both per 16 inputs ([N, K / 16]),
    in `linear_grid`'s tiles: the codes as `pack_linear` lays them, the constants tile-major. None
    where the kernel does not run."""
    packed = pack_linear(codes)
    return None if packed is None else Int4Weight(packed, _tile_major(step.float()), _tile_major(offset.float()))


def linear_grid(x: torch.Tensor, weight: Int4Weight, bits: int, out_features: int,
                bias: torch.Tensor | None) -> torch.Tensor | None:
    """x [M, K] (float32 rows, unit column stride) times a `pack_grid_tiles` (kind 4 or 8) or
    `pack_grid_tiles_halves` (kind 16) weight, plus bias: the float32 kernel's result bit for bit.
    None if the kernel declines."""
    if bits not in _GRID_TILE_FORMATS:
        raise ValueError(f"native grid linear: kind {bits} is not a grid format (4, 8 or 16)")
    return _linear_grouped(x, weight, _GRID_TILE_FORMATS[bits], out_features, bias)


# Below this many multiply-adds a LoRA product stays on the calling thread (a decode step's few
# rows of one adapter: the OpenMP region would cost more than the work).
LORA_PARALLEL_MIN_MACS = 1 << 17  # cpu_decode_step.c's LoRA products follow the same rule


def lora(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, bt: torch.Tensor, scales: torch.Tensor,
         ranks: torch.Tensor, order: torch.Tensor, group_starts: torch.Tensor, group_slots: torch.Tensor,
         y_off: int) -> bool:
    """`lora_torch`'s product in place on y for float32 CPU tensors (ranks, order, group_starts and
    group_slots as contiguous int64 tensors); False (y untouched) where the kernel does not apply."""
    lib = _library()
    if (lib is None or not _rows_ok(x) or not _rows_ok(y) or a.dtype != torch.float32 or bt.dtype != torch.float32
            or not a.is_contiguous() or not bt.is_contiguous() or scales.dtype != torch.float32
            or not scales.is_contiguous()
            or any(v.dtype != torch.int64 or not v.is_contiguous() for v in (ranks, order, group_starts, group_slots))):
        return False
    slots, r_max, k = a.shape
    n = bt.shape[2]
    if (x.shape[1] != k or bt.shape[:2] != (slots, r_max) or y_off < 0 or y_off + n > y.shape[1]
            or scales.numel() != slots or ranks.numel() != slots
            or group_starts.numel() != group_slots.numel() + 1):
        raise ValueError("native LoRA: x, y, A, Bt, scales, ranks and the groups do not agree")
    m = order.numel()
    if m == 0:
        return True
    t = torch.empty(m, r_max)
    threads = torch.get_num_threads() if m * r_max * (k + n) >= LORA_PARALLEL_MIN_MACS else 1
    status = lib.kvserve_lora_f32(x.data_ptr(), x.stride(0), k, a.data_ptr(), bt.data_ptr(), r_max, n,
                                  scales.data_ptr(), ranks.data_ptr(), order.data_ptr(), group_starts.data_ptr(),
                                  group_slots.data_ptr(), group_slots.numel(), y.data_ptr(), y.stride(0), y_off,
                                  t.data_ptr(), threads)
    if status:
        raise ValueError("native LoRA: bad sizes")
    return True
