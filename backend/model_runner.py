"""Turns a SchedulerOutput into flat tensors, runs the model, returns the logits that sample.

The flat batch (no padding between requests)::

    input_ids       [T]        tokens of request 0, then request 1, ...
    positions       [T]        absolute position of each token in its request
    slot_mapping    [T]        block_id * block_size + offset: where its K/V are stored
    query_start_loc [B+1]      request i owns rows query_start_loc[i]:query_start_loc[i+1]
    seq_lens        [B]        context length of request i after this step
    block_tables    [B, maxb]  request i's block ids, padded with the null block 0
    logits_indices  [S]        the last row of each request that samples this step

The runner never decides who runs; it only computes what it is given.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from kvserve.backend.config import EngineConfig
from kvserve.backend.cpu_threads import engine_threads, torch_default_threads
from kvserve.backend.models.arch_config import ArchConfig
from kvserve.backend.models.loader import load_model
from kvserve.backend.ops import select_ops
from kvserve.backend.scheduler import SchedulerOutput

log = logging.getLogger("kvserve.engine")


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_seq_len: int
    max_query_len: int
    decode_only: bool


class InjectedFault(RuntimeError):
    """Raised by the fault-injection test hook inside the forward pass."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, arch: ArchConfig, device: torch.device) -> torch.dtype:
    if name == "auto":
        name = arch.torch_dtype if arch.torch_dtype in ("float32", "float16", "bfloat16") else "float32"
        if device.type == "cpu" and name == "float16":
            name = "bfloat16"  # CPU matmuls in float16 are slow and lossy
    return getattr(torch, name)


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        threads = engine_threads(config.num_threads, config.cpu_reserved_cores, torch_default_threads())
        if threads is not None:
            torch.set_num_threads(threads)
            if config.num_threads and config.cpu_reserved_cores:
                log.warning("num_threads=%d given: cpu_reserved_cores=%d is ignored", threads, config.cpu_reserved_cores)
            log.info("engine uses %d CPU thread(s)", threads)
        self.device = resolve_device(config.device)
        arch = ArchConfig.from_model_dir(config.model)
        self.dtype = resolve_dtype(config.dtype, arch, self.device)
        self.max_model_len = config.max_model_len or arch.max_position_embeddings
        if self.max_model_len > arch.max_position_embeddings:
            raise ValueError(f"max_model_len: {self.max_model_len} exceeds the model's "
                             f"max_position_embeddings ({arch.max_position_embeddings})")
        if arch.sliding_window and arch.sliding_window < self.max_model_len:
            log.warning("model has a %d-token sliding window: max_model_len capped to it", arch.sliding_window)
            self.max_model_len = arch.sliding_window
        self.model, self.arch = load_model(config.model, self.dtype, self.device, self.max_model_len)
        self.ops = select_ops(config.attention_backend, self.device)
        self.block_size = config.block_size
        self.kv_dtype = self.dtype if config.kv_cache_dtype == "auto" else getattr(torch, config.kv_cache_dtype)
        self.num_blocks = self._plan_kv_blocks()
        shape = (self.num_blocks, self.block_size, arch.num_key_value_heads, arch.head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=self.kv_dtype, device=self.device),
                           torch.zeros(shape, dtype=self.kv_dtype, device=self.device))
                          for _ in range(arch.num_hidden_layers)]
        self.num_steps = 0

    @property
    def kv_bytes_per_token(self) -> int:
        return self.arch.kv_bytes_per_token(torch.finfo(self.kv_dtype).bits // 8)

    def _plan_kv_blocks(self) -> int:
        cfg = self.config
        block_bytes = self.kv_bytes_per_token * self.block_size
        if cfg.num_kv_blocks is not None:
            num_blocks = cfg.num_kv_blocks
        elif cfg.kv_cache_memory is not None:
            num_blocks = cfg.kv_cache_memory // block_bytes
        elif self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = total * cfg.gpu_memory_utilization - (total - free)
            num_blocks = int(budget // block_bytes)
        else:
            # CPU: enough for every sequence at full length, at most the default budget.
            wanted = cfg.max_num_seqs * self.max_model_len * self.kv_bytes_per_token
            num_blocks = min(wanted, cfg.default_kv_bytes) // block_bytes + 1
        num_blocks = int(num_blocks)
        usable_tokens = (num_blocks - 1) * self.block_size
        if num_blocks < 2 or usable_tokens < self.max_model_len:
            raise ValueError(
                f"max_model_len: {self.max_model_len} tokens do not fit the KV cache budget of "
                f"{max(num_blocks - 1, 0)} blocks ({usable_tokens} tokens, "
                f"{self.kv_bytes_per_token} bytes per token); raise --kv-cache-memory or lower --max-model-len")
        log.info("KV cache: %d bytes per token, %d blocks of %d tokens, %d tokens at most in flight (%.1f MiB)",
                 self.kv_bytes_per_token, num_blocks - 1, self.block_size, usable_tokens,
                 num_blocks * block_bytes / 2**20)
        return num_blocks

    def _prepare(self, out: SchedulerOutput):
        sched = out.scheduled
        q_lens = [len(s.token_ids) for s in sched]
        seq_lens = [s.start_position + n for s, n in zip(sched, q_lens)]
        max_blocks = max(len(s.block_ids) for s in sched)
        table = [s.block_ids + [0] * (max_blocks - len(s.block_ids)) for s in sched]
        dev = self.device
        block_tables = torch.tensor(table, dtype=torch.int32, device=dev)
        q_lens_t = torch.tensor(q_lens, dtype=torch.int64, device=dev)
        starts = torch.tensor([s.start_position for s in sched], dtype=torch.int64, device=dev)
        req_index = torch.repeat_interleave(torch.arange(len(sched), device=dev), q_lens_t)
        query_start_loc = torch.zeros(len(sched) + 1, dtype=torch.int64, device=dev)
        torch.cumsum(q_lens_t, 0, out=query_start_loc[1:])
        offsets = torch.arange(int(query_start_loc[-1]), device=dev) - query_start_loc[:-1][req_index]
        positions = starts[req_index] + offsets
        blocks = block_tables.long()[req_index, positions // self.block_size]
        slot_mapping = blocks * self.block_size + positions % self.block_size
        input_ids = torch.tensor([t for s in sched for t in s.token_ids], dtype=torch.int64, device=dev)
        sample_rows = [i for i, s in enumerate(sched) if s.samples]
        logits_indices = query_start_loc[1:][sample_rows] - 1
        meta = AttentionMetadata(
            slot_mapping=slot_mapping, block_tables=block_tables,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            query_start_loc=query_start_loc.to(torch.int32), max_seq_len=max(seq_lens),
            max_query_len=max(q_lens), decode_only=max(q_lens) == 1)
        return input_ids, positions, meta, logits_indices, [sched[i].request_id for i in sample_rows]

    def execute(self, out: SchedulerOutput) -> tuple[torch.Tensor, list[str]]:
        """Run one forward pass; returns (logits [S, vocab], ids of the S requests that sample)."""
        self.num_steps += 1
        # One-shot, so a test sees the engine fail and then recover.
        if self.config.fault_injection_step is not None and self.num_steps == self.config.fault_injection_step:
            raise InjectedFault(f"injected fault at step {self.num_steps}")
        input_ids, positions, meta, logits_indices, sample_ids = self._prepare(out)
        logits = self.model(self.ops, input_ids, positions, self.kv_caches, meta, logits_indices)
        return logits, sample_ids
