"""Decode steps replayed from CUDA graphs captured at start-up (off with --enforce-eager).

A small model's decode step is hundreds of short kernel launches; on a GPU the
CPU issuing them, not the GPU running them, sets the pace. A graph issues the
whole forward pass in one launch. Shapes are fixed per graph, so each captured
batch size (graph_buckets.py) owns a slice of one set of static input buffers:

    rows 0..B-1    the step's requests, copied in before the replay
    rows B..Bp-1   padding: slot -1 (nothing stored), seq_len 1 over the null block 0,
                   token 0 at position 0; their logits are never read

The decode kernel's split count is fixed at capture, chosen for max_model_len;
each program reads its request's real length from seq_lens, so any shorter
context gives the same result (splits past the end are empty and weigh nothing
in the merge). Block-table columns past a request's length are never read, so
only the columns the step uses are copied.

Only decode-only steps of at most the largest captured size replay; prefill and
mixed steps run eagerly, as on CPU, where graphs are never built.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import torch

from kvserve.backend.worker.graph_buckets import bucket

log = logging.getLogger("kvserve.engine")

Forward = Callable[[], torch.Tensor]           # one forward pass over the static buffers
Capture = Callable[[Forward], Forward]         # returns what replays it


def cuda_capture(pool) -> Capture:
    def capture(forward: Forward) -> Forward:
        forward()  # warm-up outside the capture: Triton compiles this size's kernel variants here
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = forward()

        def replay() -> torch.Tensor:
            graph.replay()
            return out
        return replay
    return capture


class DecodeGraphs:
    def __init__(self, model, ops, kv_caches, sizes: tuple[int, ...], max_model_len: int, block_size: int,
                 device: torch.device, capture: Capture | None = None) -> None:
        from kvserve.backend.worker.model_runner import AttentionMetadata  # the runner imports this module

        self.sizes = sizes
        top, width = sizes[-1], -(-max_model_len // block_size)
        self.input_ids = torch.zeros(top, dtype=torch.int64, device=device)
        self.positions = torch.zeros(top, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((top,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(top, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(top, width, dtype=torch.int32, device=device)
        # A graph reads its inputs at the addresses they had at capture and holds no reference to
        # them: every tensor the captured forward reads must live as long as the graphs. Two of them
        # were once locals here; freed after start-up, their memory went to other tensors and each
        # replay gathered the logits' rows at whatever indices lay there (a device-side assert on
        # the first replayed decode step, found by the first GPU run).
        self.query_start_loc = torch.arange(top + 1, dtype=torch.int32, device=device)
        self.rows = torch.arange(top, dtype=torch.int64, device=device)
        capture = capture or cuda_capture(torch.cuda.graph_pool_handle())
        self._replay: dict[int, Forward] = {}
        t = time.perf_counter()
        for size in reversed(sizes):  # largest first: the smaller graphs fit in the memory it pooled
            meta = AttentionMetadata(
                slot_mapping=self.slot_mapping[:size], block_tables=self.block_tables[:size],
                seq_lens=self.seq_lens[:size], query_start_loc=self.query_start_loc[:size + 1],
                max_seq_len=max_model_len, max_query_len=1, decode_only=True)

            def forward(size=size, meta=meta) -> torch.Tensor:
                return model(ops, self.input_ids[:size], self.positions[:size], kv_caches, meta, self.rows[:size])
            self._replay[size] = capture(forward)
        log.info("CUDA graphs: %d decode batch sizes captured (%s) in %.1fs; --enforce-eager turns them off",
                 len(sizes), ",".join(map(str, sizes)), time.perf_counter() - t)

    def can_run(self, batch: int) -> bool:
        return bucket(batch, self.sizes) is not None

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta, logits_indices: torch.Tensor) -> torch.Tensor:
        """The logits an eager forward would give for this decode-only step (rows `logits_indices`)."""
        batch = input_ids.shape[0]
        size = bucket(batch, self.sizes)
        assert size is not None and meta.decode_only
        self.input_ids[:batch].copy_(input_ids)
        self.positions[:batch].copy_(positions)
        self.slot_mapping[:batch].copy_(meta.slot_mapping)
        self.seq_lens[:batch].copy_(meta.seq_lens)
        self.block_tables[:batch, :meta.block_tables.shape[1]].copy_(meta.block_tables)
        if size > batch:  # padding rows: see the module docstring
            self.input_ids[batch:size].zero_()
            self.positions[batch:size].zero_()
            self.slot_mapping[batch:size].fill_(-1)
            self.seq_lens[batch:size].fill_(1)
            self.block_tables[batch:size, 0].zero_()
        # A copy: the graph's output buffer is overwritten by the next replay.
        return self._replay[size]()[logits_indices].clone()
