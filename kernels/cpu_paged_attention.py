"""The CPU path's attention over the paged KV cache, planned once per step instead of once per layer.

Same contract as `paged_attention_ref`. Decode rows are bitwise the
reference's on the torch path, and within float32 rounding where the native
kernel of cpu_native.py computes them reading the caches in place; prefill rows
run SDPA's batched (flash) path and are within float32 rounding of the
reference's unbatched call. Everything that depends only on the
step's metadata (flat slot ids of each context, masks, which rows decode,
host-side lengths) is computed once in a `PagedAttentionPlan` and reused by
every layer. Two more things matter on the CPU:

- the caches are gathered as 2-D `[slots, kv_heads * head_dim]` rows: a 3-D
  `index_select` of 256 rows took ~10x the 2-D one with two OpenMP threads on
  the shared machine (1.7 ms against 0.18 ms; 7.5 us for either on one thread):
  its parallel work is split per selected row, and every split waits for both
  threads;
- a step's metadata tensors are read on the host once (`tolist`), not per layer;
- a short prompt chunk attends as decode rows: each of its positions one query over its own prefix,
  read in place by the native decode kernel, which attends a run of rows over one context together
  (the rows of a verification step take the same path). SDPA's flash path blocks its work better
  and wins on long contexts, but below PREFILL_AS_ROWS_MAX_WORK (context length x head size) the
  rows ran faster on a 2-core Zen 4, since the kernel takes a chunk's runs of rows costliest first
  (one-off timing per layer, SDPA / rows in ms, a chunk from position 0 unless it says after what):
  head size 64 with 9 query heads over 3, 1.60 / 0.69 at 256 tokens, 6.32 / 2.59 at 512, 15.5 / 10.5
  at 1,024, 47.1 / 41.5 at 2,048, 256 after 1,024 6.83 / 5.74; head size 128 with 12 over 4, 14.6 /
  7.77 at 512, 36.9 / 30.2 at 1,024, 256 after 256 5.76 / 5.79, 256 after 1,024 14.1 / 16.8; head
  size 256 with 4 over 1, 1.94 / 1.36 at 256, 6.86 / 5.35 at 512, 10.9 / 12.2 at 768, 256 after
  256 3.87 / 3.95. The bound is where every measured case was level or better.

The caches may be float32, bfloat16 or fp8 (kernels/kv_quant.py): keys and values are quantized as
they are stored; the native kernel widens them as it loads them, the torch paths convert the rows
they gather to the query's dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kvserve.kernels import cpu_native
from kvserve.kernels.kv_quant import byte_rows, from_byte_rows, quantize


def _flat_rows(cache: torch.Tensor) -> torch.Tensor:
    """[num_blocks, block_size, Hkv, D] -> [num_blocks * block_size, Hkv * D] (a view)."""
    return cache.view(cache.shape[0] * cache.shape[1], cache.shape[2] * cache.shape[3])


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows `slots` of a cache as [len(slots), Hkv * D], in the cache's dtype (fp8 rows move as bytes)."""
    return from_byte_rows(byte_rows(_flat_rows(cache)).index_select(0, slots), cache.dtype)


def _slot_ids(block_table_rows: torch.Tensor, num_blocks: int, block_size: int) -> torch.Tensor:
    blocks = block_table_rows[..., :num_blocks].long()
    return (blocks[..., None] * block_size + torch.arange(block_size, device=blocks.device)).reshape(-1)


class _DecodePlan:
    """Batched decode: one query row per request.

    With float32 queries and the native kernel built (kernels/cpu_native.py) the
    caches (float32, bfloat16 or fp8) are read in place through the block table;
    otherwise each layer gathers the contexts, padded to the longest, and runs SDPA
    on the copies. With a sliding window, a row attends to its last `window`
    positions only, and neither path reads the positions before them: a sliding KV
    cache group has released their blocks, whose table entries are stale ids or the
    null block."""

    def __init__(self, block_tables: torch.Tensor, seq_lens: torch.Tensor, max_len: int, block_size: int,
                 num_cache_blocks: int, window: int | None = None) -> None:
        self.batch = block_tables.shape[0]
        num_blocks = (max_len + block_size - 1) // block_size
        self.window = window if window is not None and max_len > window else None
        self.native = cpu_native.available() and block_tables.device.type == "cpu"
        if self.native:
            # The kernel trusts its indices: check them here, once per step, not per token.
            if block_tables.shape[1] < num_blocks or int(seq_lens.min()) < 1 or (
                    block_tables.numel() and int(block_tables.max()) >= num_cache_blocks):
                raise ValueError("decode attention: block table shorter than a context, an empty context, "
                                 "or a block id beyond the cache")
            self.tables = block_tables.to(torch.int32).contiguous()
            self.lens = seq_lens.to(torch.int32).contiguous()
        self.span = num_blocks * block_size if self.window is None else self.window
        self._tables, self._seq_lens, self._block_size = block_tables, seq_lens, block_size
        self._gather: tuple[torch.Tensor, torch.Tensor] | None = None

    def _gather_plan(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._gather is None:
            positions = torch.arange(self.span, device=self._tables.device)[None, :]
            lens = self._seq_lens[:, None].to(self._tables.device)
            if self.window is None:
                slots = _slot_ids(self._tables, self.span // self._block_size, self._block_size)
                mask = positions < lens
            else:  # each row's own last `window` positions; a shorter context's tail is masked
                positions = positions + (lens - self.window).clamp(min=0)
                mask = positions < lens
                positions = torch.minimum(positions, lens - 1)
                blocks = self._tables.long().gather(1, positions // self._block_size)
                slots = (blocks * self._block_size + positions % self._block_size).reshape(-1)
            self._gather = (slots, mask[:, None, None, :])
        return self._gather

    def run(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
            scale: float) -> torch.Tensor:
        if self.native and cpu_native.supports(query, key_cache):
            return cpu_native.paged_decode(query, key_cache, value_cache, self.tables, self.lens, scale, self.window)
        slots, mask = self._gather_plan()
        batch, num_heads, head_dim = query.shape
        num_kv_heads = key_cache.shape[2]
        k, v = (_gather(cache, slots).view(batch, self.span, num_kv_heads, head_dim).transpose(1, 2).to(query.dtype)
                for cache in (key_cache, value_cache))
        o = F.scaled_dot_product_attention(query.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim),
                                           k, v, attn_mask=mask, scale=scale)
        return o.reshape(batch, num_heads, head_dim)


class _PrefillPlan:
    """One request's chunk of L > 1 query rows, causal over its whole context (or, with a sliding
    window, over each row's last `window` positions: only those of the chunk's first row on are
    gathered, the blocks before them having been released)."""

    def __init__(self, block_table: torch.Tensor, q_start: int, q_end: int, seq_len: int, block_size: int,
                 window: int | None = None) -> None:
        self.q_start, self.q_end, self.seq_len = q_start, q_end, seq_len
        self.window = window if window is not None and seq_len > window else None
        # The first position the chunk's first row sees.
        self.first = 0 if self.window is None else max(0, seq_len - (q_end - q_start) - self.window + 1)
        num_blocks = (seq_len + block_size - 1) // block_size
        self.slots = _slot_ids(block_table, num_blocks, block_size)[self.first:seq_len]
        self._masks: dict[int, torch.Tensor] = {}

    def _mask(self, group: int, device) -> torch.Tensor:
        mask = self._masks.get(group)
        if mask is None:
            q_len = self.q_end - self.q_start
            q_pos = torch.arange(self.seq_len - q_len, self.seq_len, device=device)
            k_pos = torch.arange(self.first, self.seq_len, device=device)
            mask = k_pos[None, :] <= q_pos[:, None]
            if self.window is not None:
                mask &= k_pos[None, :] > q_pos[:, None] - self.window
            mask = self._masks[group] = mask.repeat(group, 1)
        return mask

    def run(self, q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, scale: float) -> torch.Tensor:
        q_len, num_heads, head_dim = q.shape
        num_kv_heads = key_cache.shape[2]
        group = num_heads // num_kv_heads
        k, v = (_gather(cache, self.slots).view(self.seq_len - self.first, num_kv_heads, head_dim).to(q.dtype)
                .transpose(0, 1) for cache in (key_cache, value_cache))
        # Inputs are 4-D ([1, heads, rows, D]): torch's CPU flash attention takes only batched ones,
        # 3-D inputs fall back to its math path (bmm, softmax, mask fix-ups: ~2.5x slower here, and
        # most of a prefill step's time).
        if q_len == self.seq_len and self.window is None:
            # A chunk that starts at position 0: plain causal attention, whose flash path skips the
            # masked half. K/V are repeated per query head: is_causal needs one row per (head, position).
            o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.repeat_interleave(group, 0)[None],
                                               v.repeat_interleave(group, 0)[None], is_causal=True, scale=scale)
            return o[0].transpose(0, 1)
        # Rows ordered (group member, position): row g * L + l is query head kv * G + g at position l.
        rows = q.view(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(
            num_kv_heads, group * q_len, head_dim)
        mask = self._mask(group, q.device)[None, None]
        o = F.scaled_dot_product_attention(rows[None], k[None], v[None], attn_mask=mask, scale=scale)[0]
        return o.view(num_kv_heads, group, q_len, head_dim).permute(2, 0, 1, 3).reshape(q_len, num_heads, head_dim)


# A prompt chunk whose context length times head size is at most this attends as decode rows (see
# the module's comment), where the native kernel runs.
PREFILL_AS_ROWS_MAX_WORK = 1024 * 64


class PagedAttentionPlan:
    """What every layer's attention of one step shares, built from the step's metadata. `head_dim`
    (the caches'), which the caller passes only where the native decode kernel reads this step's
    queries and caches (`cpu_native.supports`), lets short prompt chunks attend as decode rows;
    without it they take SDPA."""

    def __init__(self, block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                 block_size: int, decode_only: bool, num_cache_blocks: int, window: int | None = None,
                 head_dim: int | None = None) -> None:
        lens = seq_lens.tolist()
        self.decode_rows: torch.Tensor | None = None
        self.decode: _DecodePlan | None = None
        self.prefills: list[_PrefillPlan] = []
        if decode_only:
            self.decode = _DecodePlan(block_tables, seq_lens, max(lens), block_size, num_cache_blocks, window)
            return
        starts = query_start_loc.tolist()
        as_rows = [i for i in range(len(lens)) if starts[i + 1] - starts[i] == 1
                   or (head_dim is not None and lens[i] * head_dim <= PREFILL_AS_ROWS_MAX_WORK)]
        if as_rows:
            # Each row of these requests one query over its own prefix: the chunk's last row sees the
            # whole context, each row before it one token less.
            dev = block_tables.device
            requests, rows, row_lens = [], [], []
            for i in as_rows:
                for r in range(starts[i], starts[i + 1]):
                    requests.append(i)
                    rows.append(r)
                    row_lens.append(lens[i] - (starts[i + 1] - 1 - r))
            if len(rows) < starts[-1]:
                self.decode_rows = torch.tensor(rows, device=dev)
            self.decode = _DecodePlan(block_tables[torch.tensor(requests, device=dev)],
                                      torch.tensor(row_lens, dtype=seq_lens.dtype, device=dev), max(row_lens),
                                      block_size, num_cache_blocks, window)
        taken = set(as_rows)
        self.prefills = [_PrefillPlan(block_tables[i], starts[i], starts[i + 1], seq_len, block_size, window)
                         for i, seq_len in enumerate(lens) if i not in taken]

    def run(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
            scale: float) -> torch.Tensor:
        """query [T, Hq, D] -> out [T, Hq, D]."""
        if self.decode is not None and self.decode_rows is None:
            return self.decode.run(query, key_cache, value_cache, scale)
        out = torch.empty_like(query)
        if self.decode is not None:
            out[self.decode_rows] = self.decode.run(query[self.decode_rows], key_cache, value_cache, scale)
        for p in self.prefills:
            out[p.q_start:p.q_end] = p.run(query[p.q_start:p.q_end], key_cache, value_cache, scale)
        return out


class KVStorePlan:
    """A step's slot mapping prepared once: the valid slots as int64, and which rows they take."""

    def __init__(self, slot_mapping: torch.Tensor) -> None:
        valid = slot_mapping >= 0
        self.rows: torch.Tensor | None = None if bool(valid.all()) else valid.nonzero().squeeze(1)
        self.slots = (slot_mapping if self.rows is None else slot_mapping[self.rows]).long()

    def store(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
              value_cache: torch.Tensor) -> None:
        if self.rows is not None:
            if self.rows.numel() == 0:
                return
            key, value = key[self.rows], value[self.rows]
        for src, cache in ((key, key_cache), (value, value_cache)):
            rows = quantize(src.reshape(src.shape[0], -1), cache.dtype)
            byte_rows(_flat_rows(cache)).index_copy_(0, self.slots, byte_rows(rows))
