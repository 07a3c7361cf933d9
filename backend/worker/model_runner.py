"""Turns a SchedulerOutput into flat tensors, runs the model, returns the logits that sample.

The flat batch (no padding between requests)::

    input_ids       [T]        tokens of request 0, then request 1, ...
    positions       [T]        absolute position of each token in its request
    slot_mapping    [T]        block_id * block_size + offset: where its K/V are stored
    query_start_loc [B+1]      request i owns rows query_start_loc[i]:query_start_loc[i+1]
    seq_lens        [B]        context length of request i after this step
    block_tables    [B, maxb]  request i's block ids, padded with the null block 0
    logits_indices  [S]        the last row of each request that samples this step

The runner never decides who runs; it only computes what it is given. It
keeps each running request's block table across steps (the scheduler sends
only the blocks a request got since its last step), so a step costs in
proportion to what changed, not to every request's whole table.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from kvserve.backend.engine import EngineConfig, SchedulerOutput
from kvserve.backend.kv_cache import (CudaMemoryProfile, blocks_for_request, cpu_kv_budget, describe, kv_budget_bytes,
                                      layer_slots, plan_groups, profile_query_lens, read_host_memory)
from kvserve.backend.models import (NATIVE_MAX_ROWS, ArchConfig, load_arch_config, load_model, pack_linears,
                                    quantize_model, wants_cpu_linear)
from kvserve.backend.worker.cpu_threads import engine_threads, torch_default_threads
from kvserve.backend.worker.kv_cache_tensors import allocate_kv_tensor, kv_element_bytes, resolve_kv_dtype
from kvserve.backend.worker.native_decode import NativeDecodeStep
from kvserve.backend.worker.ops import select_ops

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


@dataclass(frozen=True, slots=True)
class _CudaSnapshot:
    free: int
    total: int
    reserved: int
    allocated: int

    @classmethod
    def take(cls, device: torch.device) -> "_CudaSnapshot":
        free, total = torch.cuda.mem_get_info(device)  # creates the CUDA context first: it counts as used
        return cls(free, total, torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device))


class ModelRunner:
    def __init__(self, config: EngineConfig, group=None) -> None:
        """`group`: a parallel worker's (worker/parallel/worker.py). Rank 0 (the engine's runner, no
        group given) starts the workers itself when tensor_parallel_size x pipeline_parallel_size > 1."""
        self.config = config
        world = config.tensor_parallel_size * config.pipeline_parallel_size
        threads = engine_threads(config.num_threads, config.cpu_reserved_cores, torch_default_threads())
        if threads is not None and config.num_threads and config.cpu_reserved_cores:
            log.warning("num_threads=%d given: cpu_reserved_cores=%d is ignored", threads, config.cpu_reserved_cores)
        # Always set, on the thread that steps the engine: a thread begins with the count last set
        # anywhere in the process (an embedding worker's, say), not with torch's default.
        threads = threads or torch_default_threads()
        if world > 1 and group is None:
            # Every rank of this node its share of the cores (its workers get it too; another node's
            # launcher shares that node's cores among its own ranks).
            from kvserve.backend.worker.parallel.rendezvous import ranks_of_node
            threads = max(1, threads // len(ranks_of_node(world, config.nnodes, 0)))
        torch.set_num_threads(threads)
        log.info("engine uses %d CPU thread(s)%s", threads, f" per rank, {world} ranks" if world > 1 else "")
        self.device = resolve_device(config.device)
        # Taken before anything is loaded: the memory profile measures weights and activations against it.
        cuda_start = _CudaSnapshot.take(self.device) if self.device.type == "cuda" else None
        arch = load_arch_config(config.model)
        self.executor = None  # rank 0 of a parallel world: the workers' handle
        self.shard = None  # this rank's tensor-parallel part of each layer
        self.stage = None  # this rank's pipeline stage: its layers
        model_group = None  # the group of the model's own collectives (tensor parallelism's)
        micro_batches = 1
        if world > 1:
            from kvserve.backend.worker.parallel.layout import join_world
            layout = join_world(config, arch, threads, self.device, group)
            self.executor, group, self.shard, self.stage = layout.executor, layout.group, layout.shard, layout.stage
            model_group, micro_batches = layout.model_group, layout.micro_batches
        self.group = group
        self.dtype = resolve_dtype(config.dtype, arch, self.device)
        self.max_model_len = config.max_model_len or arch.max_position_embeddings
        if self.max_model_len > arch.max_position_embeddings:
            raise ValueError(f"max_model_len: {self.max_model_len} exceeds the model's "
                             f"max_position_embeddings ({arch.max_position_embeddings})")
        packs = wants_cpu_linear(self.device, self.dtype, config.quantization)
        # A GGUF file's codes, for the CPU's grid kernels (and int4's, which keeps them).
        keeps_codes = packs or (config.quantization == "int4" and self.dtype == torch.float32)
        block_codes = {} if keeps_codes else None
        self.model, self.arch = load_model(config.model, self.dtype, self.device, self.max_model_len, block_codes,
                                           self.shard, model_group, self.stage)
        quantize_model(self.model, config.quantization, self.device, block_codes)
        if packs:
            pack_linears(self.model, block_codes)
        self.lora = self._wrap_lora()
        self.ops = select_ops(config.attention_backend, self.device)
        self.block_size = config.block_size
        self.kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, self.dtype)
        self.memory_profile: CudaMemoryProfile | None = None
        # Layers by attention type (kv_cache/kv_groups.py): layer j of every group uses KV tensor j.
        self.kv_groups = plan_groups([arch.layer_window(i) for i in range(arch.num_hidden_layers)])
        self.layer_slots = layer_slots(self.kv_groups, arch.num_hidden_layers)
        # A pipeline stage holds the KV tensors of its own layers only.
        first, end = (0, arch.num_hidden_layers) if self.stage is None else (self.stage.start, self.stage.end)
        self.stage_slots = self.layer_slots[first:end]
        self.kv_tensor_ids = sorted({j for _, j in self.stage_slots})
        self.num_blocks = self._plan_kv_blocks(cuda_start)
        shape = (self.num_blocks, self.block_size, self.num_kv_heads, arch.head_dim)
        tensors = {j: (allocate_kv_tensor(shape, self.kv_dtype, self.device),
                       allocate_kv_tensor(shape, self.kv_dtype, self.device))
                   for j in self.kv_tensor_ids}
        self.kv_caches = [tensors[j] for _, j in self.stage_slots]
        # Not on a pipeline stage: the native step starts the stack with no residual, a later stage has one.
        self.model.native_decode = (None if self.stage is not None
                                    else NativeDecodeStep.for_model(self.model, self.ops, self.kv_caches))
        self.num_steps = 0
        # request id -> per group, its KV block ids in order (stale ids where a sliding group let a
        # block go: only positions outside the window map there, and the window masks them).
        self.block_tables: dict[str, list[list[int]]] = {}
        self.graphs = self._capture_graphs()
        self.pipeline = None
        if self.stage is not None:
            from kvserve.backend.worker.parallel.pipeline import PipelineStep
            self.pipeline = PipelineStep(self, group, micro_batches)

    def _wrap_lora(self):
        """With enable_lora, the adapter slots and the model's projections wrapped over them (backend/lora/)."""
        self.lora_lookup = None  # lora_int_id -> loaded adapter: the engine's registry sets it
        if not self.config.enable_lora:
            return None
        from kvserve.backend.lora import LoRASlots, TargetShapes, wrap_model
        slots = LoRASlots(TargetShapes.of(self.arch), self.config.max_loras, self.config.max_lora_rank,
                          self.device, self.dtype)
        wrap_model(self.model, slots)
        log.info("LoRA: %d adapter slot(s) of rank <= %d (%.1f MiB)", slots.num_slots, slots.max_rank,
                 slots.nbytes / 2**20)
        return slots

    def load_lora(self, lora):
        """Read and check an adapter's files against this model (any thread)."""
        from kvserve.backend.lora import TargetShapes, load_adapter
        return load_adapter(lora, TargetShapes.of(self.arch), self.config.max_lora_rank)

    @property
    def num_kv_heads(self) -> int:
        """The KV heads this rank stores: all of them without tensor parallelism."""
        return self.arch.num_key_value_heads if self.shard is None else self.shard.num_kv_heads

    @property
    def kv_bytes_per_token(self) -> int:
        return (self.arch.kv_bytes_per_token(kv_element_bytes(self.kv_dtype))
                // self.arch.num_key_value_heads * self.num_kv_heads)

    def close(self, graceful: bool = True) -> None:
        """Stop the tensor-parallel workers (nothing to do without them); `graceful=False` after one
        was lost: the others are killed, not asked (a stopped one could not answer)."""
        if self.executor is not None:
            self.executor.close(graceful)

    def check_workers(self) -> None:
        """Raise WorkerLost if a tensor-parallel worker process has exited (cheap: a waitpid each)."""
        if self.executor is not None:
            self.executor.check_alive()

    @property
    def block_bytes(self) -> int:
        """Bytes behind one block id on this rank: a block of every layer of one group (of this
        pipeline stage's layers only)."""
        per_layer = self.kv_bytes_per_token // self.arch.num_hidden_layers
        return per_layer * len(self.kv_tensor_ids) * self.block_size

    def _plan_kv_blocks(self, cuda_start: "_CudaSnapshot | None") -> int:
        cfg = self.config
        block_bytes = self.block_bytes
        if cfg.num_kv_blocks is not None:
            num_blocks = cfg.num_kv_blocks
        elif cfg.kv_cache_memory is not None:
            num_blocks = cfg.kv_cache_memory // block_bytes
        elif cuda_start is not None:
            self.memory_profile = self._profile_cuda(cuda_start)
            budget = kv_budget_bytes(self.memory_profile, cfg.gpu_memory_utilization)
            num_blocks = budget // block_bytes
            log.info(describe(self.memory_profile, cfg.gpu_memory_utilization, num_blocks * block_bytes))
        else:
            # CPU: a share of the RAM left after the weights, at most every sequence at full length.
            per_request = blocks_for_request(self.kv_groups, self.max_model_len, self.block_size)
            host = read_host_memory()
            budget = cpu_kv_budget(host and host.available, cfg.max_num_seqs * per_request * block_bytes,
                                   host.source if host else "")
            log.info("CPU KV cache size: %s; --kv-cache-memory sets it", budget.reason)
            num_blocks = budget.bytes // block_bytes + 1
        num_blocks = int(num_blocks)
        if self.group is not None:  # every rank's cache has the same block ids: the smallest budget wins
            num_blocks = self.group.min_over_ranks(num_blocks)
        one_request = blocks_for_request(self.kv_groups, self.max_model_len, self.block_size)
        if num_blocks < 2 or num_blocks - 1 < one_request:
            raise ValueError(
                f"max_model_len: {self.max_model_len} tokens need {one_request} KV blocks, more than the budget "
                f"of {max(num_blocks - 1, 0)} blocks ({block_bytes} bytes each); raise --kv-cache-memory or "
                f"lower --max-model-len")
        windows = sorted({g.window for g in self.kv_groups if g.window is not None})
        log.info("KV cache: %s, %d groups of %d layers (%d full, %d sliding%s), %d blocks of %d tokens "
                 "(%d bytes each, %.1f MiB, %d tokens); one %d-token request holds %d blocks",
                 str(self.kv_dtype).removeprefix("torch."),
                 len(self.kv_groups), len(self.kv_groups[0].layers),
                 sum(g.window is None for g in self.kv_groups), sum(g.window is not None for g in self.kv_groups),
                 f", window {windows[0]}" if windows else "", num_blocks - 1, self.block_size, block_bytes,
                 num_blocks * block_bytes / 2**20, (num_blocks - 1) * self.block_size, self.max_model_len,
                 one_request)
        return num_blocks

    def _capture_graphs(self):
        """Decode CUDA graphs on CUDA with the Triton kernels (the torch path syncs with the host)."""
        if self.device.type != "cuda" or self.config.enforce_eager or self.ops.name != "triton":
            return None
        if self.group is not None:  # the collectives between the layers are not captured yet
            log.info("CUDA graphs are not captured with tensor parallelism: decode runs eagerly")
            return None
        if self.lora is not None:  # each step's adapter rows are not part of a captured graph
            log.info("CUDA graphs are not captured with --enable-lora: decode runs eagerly")
            return None
        if len(self.kv_groups) > 1 or self.kv_groups[0].window is not None:
            log.info("CUDA graphs are not captured for sliding-window models yet: decode runs eagerly")
            return None
        from kvserve.backend.worker.cuda_graphs import DecodeGraphs
        from kvserve.backend.worker.graph_buckets import capture_sizes

        try:
            return DecodeGraphs(self.model, self.ops, self.kv_caches, capture_sizes(self.config.max_num_seqs),
                                self.max_model_len, self.block_size, self.device)
        except RuntimeError as exc:  # serve eagerly rather than not at all
            log.warning("CUDA graph capture failed, decode runs eagerly: %s", exc)
            torch.cuda.synchronize(self.device)
            return None

    def _profile_cuda(self, start: "_CudaSnapshot") -> CudaMemoryProfile:
        dev = self.device
        torch.cuda.synchronize(dev)
        weights = torch.cuda.memory_allocated(dev) - start.allocated
        torch.cuda.reset_peak_memory_stats(dev)
        self.profile_step()
        torch.cuda.synchronize(dev)
        peak_activation = max(0, torch.cuda.max_memory_allocated(dev) - start.allocated - weights)
        free, _ = torch.cuda.mem_get_info(dev)
        # Growth of the device's used memory that torch's allocator does not account for.
        non_torch = max(0, (start.free - free) - (torch.cuda.memory_reserved(dev) - start.reserved))
        torch.cuda.empty_cache()
        return CudaMemoryProfile(total=start.total, free_at_start=start.free, weights=weights,
                                 peak_activation=peak_activation, non_torch=non_torch)

    def profile_step(self) -> torch.Tensor:
        """One forward pass of the largest step the scheduler can hand out, before the KV cache exists.

        `max_num_batched_tokens` prompt tokens spread over up to `max_num_seqs` requests, every
        request sampling, into a one-block cache with every slot -1 (nothing is stored; the
        attention reads the null block): the activations are those of a real step of that size.
        Returns the sampler-shaped float32 logits [num_seqs, vocab].
        """
        cfg, dev, arch = self.config, self.device, self.arch
        q_lens = profile_query_lens(cfg.max_num_batched_tokens, cfg.max_num_seqs, self.max_model_len)
        num_tokens, num_seqs = sum(q_lens), len(q_lens)
        width = -(-max(q_lens) // self.block_size)
        positions = torch.cat([torch.arange(n, device=dev) for n in q_lens])
        query_start_loc = torch.zeros(num_seqs + 1, dtype=torch.int32, device=dev)
        torch.cumsum(torch.tensor(q_lens, dtype=torch.int32, device=dev), 0, out=query_start_loc[1:])
        meta = AttentionMetadata(
            slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=dev),
            block_tables=torch.zeros(num_seqs, width, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(q_lens, dtype=torch.int32, device=dev), query_start_loc=query_start_loc,
            max_seq_len=max(q_lens), max_query_len=max(q_lens), decode_only=max(q_lens) == 1)
        shape = (1, self.block_size, self.num_kv_heads, arch.head_dim)
        null_cache = torch.zeros(shape, dtype=self.kv_dtype, device=dev)
        caches = [(null_cache, null_cache)] * arch.num_hidden_layers
        input_ids = torch.randint(0, arch.vocab_size, (num_tokens,), device=dev)
        if self.stage is not None:  # this stage alone, on made-up activations where it takes them
            return self._profile_stage(input_ids, positions, caches, meta, query_start_loc[1:].long() - 1)
        logits = self.model(self.ops, input_ids, positions, caches, meta, query_start_loc[1:].long() - 1)
        # The sampler's worst case (top-p) sorts and softmaxes every row: its copies count too.
        torch.sort(logits, dim=-1, descending=True)
        torch.softmax(logits, dim=-1)
        return logits

    def _profile_stage(self, input_ids, positions, caches, meta, logits_indices) -> torch.Tensor:
        inputs, residual = input_ids, None
        if not self.stage.first:
            inputs = torch.randn(input_ids.shape[0], self.arch.hidden_size, dtype=self.dtype, device=self.device)
            residual = torch.zeros_like(inputs)
        result = self.model.forward_stage(self.ops, inputs, residual, positions, caches, meta, logits_indices)
        if not self.stage.last:
            return result[0]
        torch.sort(result, dim=-1, descending=True)
        torch.softmax(result, dim=-1)
        return result

    def update_block_tables(self, out: SchedulerOutput) -> None:
        """Forget finished and preempted requests' tables, then append the new blocks
        (in this order: a request preempted and restarted in one step starts afresh)."""
        if self.executor is not None:
            self.executor.send("tables", out)
        self._update_block_tables(out)

    def _update_block_tables(self, out: SchedulerOutput) -> None:
        tables = self.block_tables
        for rid in (*out.finished_request_ids, *out.preempted_request_ids):
            tables.pop(rid, None)
        for s in out.scheduled:
            table = tables.get(s.request_id)
            if table is None:
                tables[s.request_id] = [list(ids) for ids in s.new_block_ids]
            else:
                for group_table, ids in zip(table, s.new_block_ids):
                    group_table.extend(ids)

    def reset_block_tables(self) -> None:
        """After a failed step: every request was failed, none of their tables is needed."""
        if self.executor is not None:
            self.executor.send("reset", None)
        self.block_tables.clear()

    def _prepare(self, out: SchedulerOutput):
        sched = out.scheduled
        if all(len(s.token_ids) == 1 for s in sched) and not out.scores_prompts:
            return self._prepare_decode(sched)
        return self._prepare_general(sched)

    def _prepare_general(self, sched):
        q_lens = [len(s.token_ids) for s in sched]
        seq_lens = [s.start_position + n for s, n in zip(sched, q_lens)]
        dev = self.device
        q_lens_t = torch.tensor(q_lens, dtype=torch.int64, device=dev)
        starts = torch.tensor([s.start_position for s in sched], dtype=torch.int64, device=dev)
        req_index = torch.repeat_interleave(torch.arange(len(sched), device=dev), q_lens_t)
        query_start_loc = torch.zeros(len(sched) + 1, dtype=torch.int64, device=dev)
        torch.cumsum(q_lens_t, 0, out=query_start_loc[1:])
        offsets = torch.arange(int(query_start_loc[-1]), device=dev) - query_start_loc[:-1][req_index]
        positions = starts[req_index] + offsets
        input_ids = torch.tensor([t for s in sched for t in s.token_ids], dtype=torch.int64, device=dev)
        sample_rows = [i for i, s in enumerate(sched) if s.samples]
        logits_indices = query_start_loc[1:][sample_rows] - 1
        if any(s.num_spec_tokens or s.prompt_logits for s in sched):
            logits_indices = torch.tensor(_logit_rows(sched, query_start_loc.tolist()), dtype=torch.int64, device=dev)
        as_decode_rows = self._verifies_as_decode_rows(sched, q_lens)
        if as_decode_rows:  # one query per row, over its own context: see _verifies_as_decode_rows
            seq_lens_t = (positions + 1).to(torch.int32)
            query_start_loc = torch.arange(len(input_ids) + 1, dtype=torch.int64, device=dev)
        else:
            seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=dev)
        group_metas = []
        for g in range(len(self.kv_groups)):
            block_tables = self._padded_tables([self.block_tables[s.request_id][g] for s in sched])
            blocks = block_tables.long()[req_index, positions // self.block_size]
            if as_decode_rows:
                block_tables = block_tables[req_index]
            group_metas.append(AttentionMetadata(
                slot_mapping=blocks * self.block_size + positions % self.block_size, block_tables=block_tables,
                seq_lens=seq_lens_t, query_start_loc=query_start_loc.to(torch.int32), max_seq_len=max(seq_lens),
                max_query_len=1 if as_decode_rows else max(q_lens), decode_only=as_decode_rows or max(q_lens) == 1))
        sample_ids = [sched[i].request_id for i in sample_rows]
        return input_ids, positions, self._layer_metas(group_metas), logits_indices, sample_ids

    def _prepare_decode(self, sched):
        """_prepare_general for a step of one token per request (every plain decode step): the same tensors,
        computed on Python ints and made once each. The general path's ~20 small torch operations
        took 0.25 ms of a 6 ms batch-1 step of SmolLM2 here; this takes a fifth of that."""
        dev, block_size = self.device, self.block_size
        positions = [s.start_position for s in sched]
        input_ids = torch.tensor([s.token_ids[0] for s in sched], dtype=torch.int64, device=dev)
        positions_t = torch.tensor(positions, dtype=torch.int64, device=dev)
        seq_lens_t = torch.tensor([p + 1 for p in positions], dtype=torch.int32, device=dev)
        query_start_loc = torch.arange(len(sched) + 1, dtype=torch.int32, device=dev)
        sample_rows = [i for i, s in enumerate(sched) if s.samples]
        logits_indices = torch.tensor(sample_rows, dtype=torch.int64, device=dev)
        group_metas = []
        for g in range(len(self.kv_groups)):
            rows = [self.block_tables[s.request_id][g] for s in sched]
            slots = [r[p // block_size] * block_size + p % block_size for r, p in zip(rows, positions)]
            group_metas.append(AttentionMetadata(
                slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev), block_tables=self._padded_tables(rows),
                seq_lens=seq_lens_t, query_start_loc=query_start_loc, max_seq_len=max(positions) + 1,
                max_query_len=1, decode_only=True))
        sample_ids = [sched[i].request_id for i in sample_rows]
        return input_ids, positions_t, self._layer_metas(group_metas), logits_indices, sample_ids

    def _padded_tables(self, rows: list[list[int]]) -> torch.Tensor:
        """One KV group's block tables of this step's requests as int32 [B, widest], padded with the null block 0."""
        width = max(len(r) for r in rows)
        return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32, device=self.device)

    def _layer_metas(self, group_metas: list[AttentionMetadata]):
        """The metadata the model takes: one model of one group gets the metadata itself, as the CUDA
        graphs expect; else this stage's layers each get their group's."""
        return group_metas[0] if len(group_metas) == 1 else [group_metas[g] for g, _ in self.stage_slots]

    def _verifies_as_decode_rows(self, sched, q_lens: list[int]) -> bool:
        """Whether this step's attention runs as decode rows: on the CPU, a step whose requests each
        bring their last token and their proposals only (decodes and speculative verifications, no
        prompt chunk), at most NATIVE_MAX_ROWS rows in all. Each row is then one query over its own
        context (its request's block table, length position + 1): every row's KV is written before
        any row attends, so row j sees the proposals before it and none after, as the causal
        prefill would show them. The decode kernels, and the native decode step, then verify k
        proposals in the one call a plain decode step takes. Through the prefill path a verification
        step ran operation by operation (27.6 ms at batch 1 on SmolLM2 here, against the native
        step's 16.7 ms), and served speculation gained nothing at batch 1. CUDA keeps the prefill
        kernel for verification (the path checked on the GPU)."""
        return (self.device.type == "cpu" and any(s.num_spec_tokens for s in sched)
                and sum(q_lens) <= NATIVE_MAX_ROWS
                and all(n == 1 + s.num_spec_tokens for s, n in zip(sched, q_lens)))

    def execute(self, out: SchedulerOutput) -> tuple[torch.Tensor, list[str]]:
        """Run one forward pass; returns (logits [S, vocab], ids of the S requests that sample).
        Rank 0 of a parallel world first hands `out` to the workers, which run the same (a pipeline
        stage: its layers; a worker's result is None)."""
        if self.executor is not None:
            self.executor.send("step", out)
        self._update_block_tables(out)  # first: whatever fails below, the tables follow the scheduler
        self.num_steps += 1
        # One-shot, so a test sees the engine fail and then recover.
        fault_step = self.config.debug.fault_injection_step
        if fault_step is not None and self.num_steps == fault_step:
            raise InjectedFault(f"injected fault at step {self.num_steps}")
        if self.pipeline is not None:  # this stage's part, micro-batch by micro-batch; logits on rank 0 only
            return self.pipeline.execute(out)
        input_ids, positions, meta, logits_indices, sample_ids = self._prepare(out)
        if self.lora is not None:  # each request's rows run with its adapter (0: none)
            self.lora.prepare([s.lora_int_id for s in out.scheduled], [len(s.token_ids) for s in out.scheduled],
                              self.lora_lookup)
        if (self.graphs is not None and meta.decode_only and not out.scores_prompts
                and self.graphs.can_run(input_ids.shape[0])):
            return self.graphs.run(input_ids, positions, meta, logits_indices), sample_ids
        logits = self.model(self.ops, input_ids, positions, self.kv_caches, meta, logits_indices)
        return logits, sample_ids


def _logit_rows(sched, query_start_loc: list[int]) -> list[int]:
    """The rows whose logits a step returns, request by request in order: its prompt-scoring rows
    (prompt logprobs), then its sampling rows (one; a request verifying k proposals, its last
    1 + k in order). The engine splits the logits by the same walk."""
    rows: list[int] = []
    for s, start, end in zip(sched, query_start_loc, query_start_loc[1:]):
        rows.extend(range(start, start + s.prompt_logits))
        if s.samples:
            rows.extend(range(end - 1 - s.num_spec_tokens, end))
    return rows
