"""The decoder stack of a decode step as one native call (kernels/cpu_decode_step.c), for the
Llama family and Gemma 3.

At batch 1 on SmolLM2 the per-operation path spent ~3 ms of a ~7 ms step in Python between
kernels (issue #30): 30 layers of ~30 dispatches. A step whose rows are all decodes, on the CPU
path's own kernels, runs here instead: the same kernels in the same order with the same thread
counts, so its tokens are the other path's bit for bit. Everything the C side needs that does
not change between steps (each layer's kernel choice, packed weights, norms, caches) is built
once per row count; a step only fills in its block tables.

A step is declined (the per-operation path runs, nothing changed) where the two could differ
or a kernel is missing: ops other than TorchOps (Triton); non-decode rows or more than 64 rows;
a KV cache dtype the attention kernel does not read (it reads float32, bfloat16 and both fp8s);
a projection not on a native kernel at this row count (oneDNN-only); LoRA stacks other than
contiguous float32 ones on the CPU; a Llama-family model's q/k norms (Qwen3's per-head norm runs in
torch; Gemma's is native); exact GELU; a tensor-parallel shard (its all-reduces sit between the
operations); or a shape beyond the attention kernel's bounds.
KVSERVE_CPU_DECODE_STEP=0 turns it off (for A/B measurements).

With --enable-lora, steps with adapter rows take it too (issue #33): the slots' stacks and this
step's row groups go in as one descriptor per target (`_LoRAStep`), and the C side adds each
target's grouped shrink/expand (kernels/cpu_lora.c) after its projection, as the wrapped
projections of backend/lora/layers.py do from Python: the same kernel on the same rows, so
adapter steps too equal the per-operation path bit for bit.

On two threads, a step that reads much more K/V than weights runs its rows as two halves, each a
whole step on one thread (`_halves`): one half's projections then use the FMA units while the
other's attention waits on memory, where split operation by operation both threads wait at once.
"""
from __future__ import annotations

import ctypes
import os

import torch

from kvserve.backend.models import (NATIVE_MAX_ROWS, Gemma3ForCausalLM, Int4Linear, Int8Linear, LlamaForCausalLM,
                                    PackedLinear)
from kvserve.backend.worker.ops import TorchOps
from kvserve.kernels import cpu_native

# cpu_decode_step.c's LIN_* and the ctypes mirrors of its structs (field for field).
_LIN_F32, _LIN_I8, _LIN_GROUPED, _LIN_STRIPS = 0, 1, 2, 3
_i64, _p, _f = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float


# Two halves (cpu_decode_step.c) from this many rows, where the step's K/V reads are at least this
# many times its weights' bytes (each half reads the weights again). Measured on the 2-core VM's
# decode steps (BENCHMARKS.md section 7, eighteenth point): SmolLM2's grid codes gained from 12 rows
# at 256-384 tokens (K/V 2.2x the weights) and at 8 rows of 1,000 (4.9x), and lost 2.5 % at 8 rows
# of 256-384 (1.5x); its float32 weights lost 2 % at 16 rows (0.55x) and gained 8 % at 64 (2.2x).
HALVES_MIN_ROWS = 8
HALVES_MIN_KV_TO_WEIGHTS = 2.0


class _Linear(ctypes.Structure):
    _fields_ = [("kind", _i64), ("format", _i64), ("packed", _p), ("scales", _p), ("zeros", _p), ("bias", _p),
                ("out_features", _i64), ("in_features", _i64)]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Linear), ("o", _Linear), ("gate_up", _Linear), ("down", _Linear),
                ("input_norm", _p), ("attn_output_norm", _p), ("pre_mlp_norm", _p), ("mlp_output_norm", _p),
                ("q_norm", _p), ("k_norm", _p), ("cos", _p), ("sin", _p), ("gelu", _i64),
                ("key_cache", _p), ("value_cache", _p), ("kv_format", _i64), ("kv_values", _p),
                ("tables", _p), ("table_stride", _i64), ("lens", _p), ("slots", _p), ("window", _i64)]


class _LoRATarget(ctypes.Structure):
    _fields_ = [("a", _p), ("bt", _p), ("ranks", _p), ("in_features", _i64), ("out_features", _i64),
                ("y_off", _i64), ("order", _p), ("group_starts", _p), ("group_slots", _p), ("rows", _i64),
                ("groups", _i64)]


# The C side's LORA_* order: backend/lora/adapter.py's TARGETS (not imported: lora/ loads only with
# --enable-lora). Within a fused projection it is also the wrapper's order of segments.
_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class _LoRAStep(ctypes.Structure):
    _fields_ = [("targets", _LoRATarget * len(_LORA_TARGETS)), ("scales", _p), ("slots", _i64), ("r_max", _i64),
                ("parallel_min_macs", _i64)]


class _Shape(ctypes.Structure):
    _fields_ = [("rows", _i64), ("hidden", _i64), ("intermediate", _i64), ("num_heads", _i64),
                ("num_kv_heads", _i64), ("head_dim", _i64), ("block_size", _i64), ("rotary_half", _i64),
                ("eps", _f), ("scale", _f), ("num_threads", _i64), ("parallel_min_elements", _i64),
                ("lora", ctypes.POINTER(_LoRAStep)), ("split_row", _i64)]


MAX_ROWS = NATIVE_MAX_ROWS  # above it the projections leave the native kernels


def _is_lora(linear) -> bool:
    """A backend/lora/layers.py LoRAProjection, known by its name: the model runner imports lora/
    only with --enable-lora."""
    return type(linear).__name__ == "LoRAProjection"


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _describe(linear, rows: int) -> tuple[_Linear, list[torch.Tensor]] | None:
    """The kernel `linear.forward` picks for `rows` float32 rows, as a descriptor (with the tensors
    it points into, kept alive by the caller), or None where that is not a native kernel. A LoRA
    wrapper is described by its base: its adapters' products come in `_LoRAStep`."""
    if _is_lora(linear):
        linear = linear.base
    bias_tensor = getattr(linear, "bias", None)
    keep = [] if bias_tensor is None else [bias_tensor]
    bias = _ptr(bias_tensor)
    if type(linear) is PackedLinear:
        grid = linear.grid
        if grid is not None and rows <= linear.strip_max_rows:
            d = _Linear(_LIN_STRIPS, grid.kind, _ptr(grid.strips), None, None, bias)
            keep.append(grid.strips)
        elif grid is not None and grid.tiles is not None and rows <= linear.max_native_rows:
            tiles = grid.tiles
            zeros = tiles.zeros if tiles.zeros.numel() else None
            d = _Linear(_LIN_GROUPED, cpu_native.grid_tile_format(grid.kind), _ptr(tiles.codes), _ptr(tiles.scales),
                        _ptr(zeros), bias)
            keep += [tiles.codes, tiles.scales, tiles.zeros]
        elif linear.native is not None and rows <= linear.max_native_rows:
            d = _Linear(_LIN_F32, 0, _ptr(linear.native), None, None, bias)
            keep.append(linear.native)
        else:
            return None
    elif type(linear) is Int8Linear and linear.native is not None:
        d = _Linear(_LIN_I8, 0, _ptr(linear.native), _ptr(linear.native_scales), None, bias)
        keep += [linear.native, linear.native_scales]
    elif type(linear) is Int4Linear and linear.native is not None and rows >= linear.native_min_rows:
        w = linear.native
        d = _Linear(_LIN_GROUPED, cpu_native.INT4_FORMAT, _ptr(w.codes), _ptr(w.scales), _ptr(w.zeros), bias)
        keep += [w.codes, w.scales, w.zeros]
    elif type(linear) is Int4Linear and linear.strips is not None:
        d = _Linear(_LIN_STRIPS, linear.strip_kind, _ptr(linear.strips), None, None, bias)
        keep.append(linear.strips)
    else:
        return None
    d.out_features, d.in_features = linear.out_features, linear.in_features
    return d, keep


def _family(model) -> str | None:
    """"llama" or "gemma3" where the native step computes what the model's layers do, else None."""
    if getattr(model, "group", None) is not None:
        return None  # a tensor-parallel shard: its all-reduces run between the layers' operations
    if type(model) is LlamaForCausalLM and not model.cfg.qk_norm:
        return "llama"
    if type(model) is Gemma3ForCausalLM and all(layer.approximate == "tanh" for layer in model.layers):
        return "gemma3"
    return None


def _norms(family: str, layer) -> dict[str, torch.Tensor | None]:
    """The layer's norms by the C struct's field names."""
    if family == "llama":
        return dict(input_norm=layer.input_layernorm, attn_output_norm=None, pre_mlp_norm=layer.post_attention_layernorm,
                    mlp_output_norm=None, q_norm=None, k_norm=None)
    return dict(input_norm=layer.input_layernorm, attn_output_norm=layer.post_attention_layernorm,
                pre_mlp_norm=layer.pre_feedforward_layernorm, mlp_output_norm=layer.post_feedforward_layernorm,
                q_norm=layer.q_norm, k_norm=layer.k_norm)


class NativeDecodeStep:
    """Runs a model's layers for decode steps through kvserve_decode_step_f32."""

    def __init__(self, model, kv_caches) -> None:
        cfg = model.cfg
        self.model = model
        self.family = _family(model)
        self.kv_caches = kv_caches
        # Each layer's rotary table: Gemma's sliding layers turn by their own theta.
        local = getattr(model, "local_cos_sin_cache", None)
        self.rotary_tables = [local if local is not None and layer.window is not None else model.cos_sin_cache
                              for layer in model.layers]
        self.num_layers = len(model.layers)
        first = model.layers[0]
        self.shape = dict(hidden=cfg.hidden_size, intermediate=cfg.intermediate_size, num_heads=first.num_heads,
                          num_kv_heads=first.num_kv_heads, head_dim=first.head_dim,
                          block_size=kv_caches[0][0].shape[1], rotary_half=model.cos_sin_cache.shape[1] // 2,
                          eps=first.eps, scale=model.scale)
        # Per row count: the layers' descriptors, the tensors they point into, and the bytes of the
        # projections' weights that a step reads.
        self._by_rows: dict[int, tuple[ctypes.Array, list[torch.Tensor], int] | None] = {}
        self.kv_position_bytes = 2 * first.num_kv_heads * first.head_dim * kv_caches[0][0].element_size()
        # With --enable-lora: the adapter slots, whose `step` is None in steps with no adapter rows,
        # and the descriptor their steps fill in (None: adapter steps decline).
        qkv = model.layers[0].qkv_proj
        self.lora_slots = qkv.slots if _is_lora(qkv) else None
        self.lora = _lora_step(model, self.lora_slots) if self.lora_slots is not None else None

    @classmethod
    def for_model(cls, model, ops, kv_caches) -> "NativeDecodeStep | None":
        """The native step for this model on these ops and caches, or None where it never applies."""
        if os.environ.get("KVSERVE_CPU_DECODE_STEP", "1") == "0" or not cpu_native.linear_available():
            return None
        if type(ops) is not TorchOps or _family(model) is None:
            return None
        caches_ok = all(cpu_native.kv_format(t.dtype) is not None and t.dtype == kv_caches[0][0].dtype
                        and t.device.type == "cpu" and t.is_contiguous() for pair in kv_caches for t in pair)
        first = model.layers[0]
        if (not caches_ok or first.num_heads > cpu_native.MAX_HEADS or first.head_dim > cpu_native.MAX_HEAD_DIM
                or kv_caches[0][0].shape[1] > cpu_native.MAX_BLOCK or first.num_heads % first.num_kv_heads
                or model.cos_sin_cache.shape[1] > first.head_dim):
            return None
        return cls(model, kv_caches)

    def _layers(self, rows: int):
        if rows not in self._by_rows:
            self._by_rows[rows] = self._build(rows)
        return self._by_rows[rows]

    def _build(self, rows: int):
        layers = (_Layer * self.num_layers)()
        keep: list[torch.Tensor] = []
        weight_bytes = 0
        for i, (layer, (key_cache, value_cache)) in enumerate(zip(self.model.layers, self.kv_caches)):
            entry = layers[i]
            for field in ("qkv", "o", "gate_up", "down"):
                described = _describe(getattr(layer, f"{field}_proj"), rows)
                if described is None:
                    return None
                setattr(entry, field, described[0])
                keep += described[1]
                weight_bytes += sum(t.nbytes for t in described[1])
            for name, norm in _norms(self.family, layer).items():
                if norm is not None and (norm.dtype != torch.float32 or not norm.is_contiguous()):
                    return None
                setattr(entry, name, _ptr(norm))
                keep.append(norm)
            entry.gelu = int(self.family == "gemma3")
            entry.key_cache, entry.value_cache = _ptr(key_cache), _ptr(value_cache)
            entry.kv_format, entry.kv_values = cpu_native.kv_format(key_cache.dtype), cpu_native.kv_values(key_cache.dtype)
            entry.window = layer.window or 0
        return layers, keep, weight_bytes

    def run(self, x: torch.Tensor, positions: torch.Tensor, metas: list) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(x, residual) after the last layer, or None: the step is not one this path takes."""
        rows = x.shape[0]
        lora_step = None if self.lora_slots is None else self.lora_slots.step
        if (rows > MAX_ROWS or x.dtype != torch.float32 or not x.is_contiguous()
                or not all(meta.decode_only for meta in metas)
                or (lora_step is not None and self.lora is None)):
            return None
        built = self._layers(rows)
        if built is None:
            return None
        layers, _, weight_bytes = built
        # Each KV group's and each rotary table's tensors are made (and their addresses read) once a
        # step, then written into every layer's entry: this loop runs every decode step.
        step_tensors = []
        groups: dict[int, tuple[int, int, int, int]] = {}  # KV group (its metadata's id) -> addresses
        for i, meta in enumerate(metas):
            ptrs = groups.get(id(meta))
            if ptrs is None:
                group = self._tables(meta)
                if group is None:
                    return None
                step_tensors.append(group)
                tables, lens, slots = group
                ptrs = groups[id(meta)] = (tables.data_ptr(), tables.stride(0), lens.data_ptr(), slots.data_ptr())
            entry = layers[i]
            entry.tables, entry.table_stride, entry.lens, entry.slots = ptrs
        angles: dict[int, tuple[int, int]] = {}  # rotary table id -> the addresses of this step's cos, sin
        index = positions.long()
        for i, table in enumerate(self.rotary_tables):
            cos_sin = angles.get(id(table))
            if cos_sin is None:
                cos, sin = (half.contiguous() for half in table[index].float().chunk(2, dim=-1))
                step_tensors.append((cos, sin))
                cos_sin = angles[id(table)] = (cos.data_ptr(), sin.data_ptr())
            layers[i].cos, layers[i].sin = cos_sin
        x_out, residual = torch.empty_like(x), torch.empty_like(x)
        num_threads = torch.get_num_threads()
        split_row = 0
        if num_threads == 2 and lora_step is None and self._halves(rows, metas, weight_bytes):
            first_tables, first_lens, _ = step_tensors[0]  # the first layer's KV group (appended first above)
            split_row = middle_request_start(first_tables, first_lens)
        shape = _Shape(rows=rows, num_threads=num_threads, parallel_min_elements=cpu_native.PARALLEL_MIN_ELEMENTS,
                       split_row=split_row, **self.shape)
        if lora_step is not None:
            if not self._fill_lora(lora_step, rows):
                return None
            shape.lora = ctypes.pointer(self.lora)
        status = cpu_native.decode_step(ctypes.byref(shape), layers, self.num_layers, x.data_ptr(), x_out.data_ptr(),
                                        residual.data_ptr())
        return None if status else (x_out, residual)

    def _halves(self, rows: int, metas: list, weight_bytes: int) -> bool:
        """Whether this step's rows run as two halves: enough rows, and K/V reads (each layer's rows'
        visible positions) of at least HALVES_MIN_KV_TO_WEIGHTS times the weights'."""
        if rows < HALVES_MIN_ROWS:
            return False
        positions, by_group = 0, {}
        for meta, layer in zip(metas, self.model.layers):
            key = (id(meta), layer.window)
            if key not in by_group:
                lens = meta.seq_lens if not layer.window else meta.seq_lens.clamp(max=layer.window)
                by_group[key] = int(lens.sum())
            positions += by_group[key]
        return positions * self.kv_position_bytes >= HALVES_MIN_KV_TO_WEIGHTS * weight_bytes

    def _fill_lora(self, step: dict, rows: int) -> bool:
        """This step's row groups into the LoRA descriptor (its stacks' pointers are fixed); False
        where they do not fit the step (the kernel trusts its row indices, and the C side's scratch
        holds `rows` rows). The groups' tensors stay alive in the slots' `step` for the call."""
        for i, name in enumerate(_LORA_TARGETS):
            target, groups = self.lora.targets[i], step.get(name)
            if groups is None or target.in_features == 0:
                target.rows = 0
                continue
            if groups.order.numel() > rows or (groups.order.numel() and int(groups.order.max()) >= rows):
                return False
            target.order, target.group_starts = groups.order.data_ptr(), groups.group_starts.data_ptr()
            target.group_slots = groups.group_slots.data_ptr()
            target.rows, target.groups = groups.order.numel(), groups.group_slots.numel()
        return True

    def _tables(self, meta) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The group's int32 tables and lengths and its int64 slots, the first two checked as the attention plan checks them (the
        kernel trusts its indices)."""
        tables, lens = meta.block_tables, meta.seq_lens
        if tables.device.type != "cpu" or lens.numel() == 0 or meta.slot_mapping.numel() != lens.numel():
            return None
        block_size = self.shape["block_size"]
        max_len = int(lens.max())
        if (int(lens.min()) < 1 or tables.shape[1] * block_size < max_len
                or (tables.numel() and int(tables.max()) >= self.kv_caches[0][0].shape[0])):
            return None
        return (tables.to(torch.int32).contiguous(), lens.to(torch.int32).contiguous(),
                meta.slot_mapping.long().contiguous())


def middle_request_start(tables: torch.Tensor, lens: torch.Tensor) -> int:
    """The row nearest the middle where a request starts, or 0 where one request holds every row.
    A request's rows (a verification's) share their block table and have lengths one apart; two
    requests never share the block a decode row writes to."""
    rows = lens.numel()
    same = (tables[1:] == tables[:-1]).all(dim=1) & (lens[1:] == lens[:-1] + 1)
    starts = (~same).nonzero().flatten() + 1
    return int(starts[(starts - rows // 2).abs().argmin()]) if starts.numel() else 0


def _lora_step(model, slots) -> _LoRAStep | None:
    """The descriptor of the slots' stacks for every target (rows filled in per step), or None where
    the C side cannot read them as cpu_native.lora does (then adapter steps run per operation)."""
    step = _LoRAStep(scales=_ptr(slots.scales), slots=slots.num_slots, r_max=slots.max_rank,
                     parallel_min_macs=cpu_native.LORA_PARALLEL_MIN_MACS)
    tensors = [slots.scales, *slots.ranks.values(), *slots.a.values(), *slots.bt.values()]
    if any(t.device.type != "cpu" or not t.is_contiguous() for t in tensors) or slots.scales.dtype != torch.float32:
        return None
    layer = model.layers[0]
    seen = []
    for proj in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
        for name, offset in getattr(layer, proj).segments:
            seen.append(name)
            if name not in slots.a:
                continue
            a, bt, ranks = slots.a[name], slots.bt[name], slots.ranks[name]
            if a.dtype != torch.float32 or bt.dtype != torch.float32 or ranks.dtype != torch.int64:
                return None
            target = step.targets[_LORA_TARGETS.index(name)]
            target.a, target.bt, target.ranks = _ptr(a), _ptr(bt), _ptr(ranks)
            target.in_features, target.out_features, target.y_off = a.shape[3], bt.shape[3], offset
    if seen != list(_LORA_TARGETS):  # the C side adds a projection's targets in this order
        return None
    return step
