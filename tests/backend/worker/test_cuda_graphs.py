"""Decode CUDA graphs: the bucketing, and the static-buffer path checked on the CPU.

On the CPU no graph is captured; the test replaces the capture with a plain call of the
same forward over the same static buffers, so padding, copies and the fixed split count
are checked against the eager step without a GPU (the GPU check runs the real graphs).
"""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from kvserve.backend.engine.config import EngineConfig
from kvserve.backend.engine.scheduler import ScheduledRequest, SchedulerOutput
from kvserve.backend.worker.cuda_graphs import DecodeGraphs
from kvserve.backend.worker.graph_buckets import bucket, capture_sizes
from kvserve.backend.worker.model_runner import ModelRunner


def test_capture_sizes_follow_vllms_ladder_up_to_max_num_seqs():
    assert capture_sizes(256) == (1, 2, 4, *range(8, 257, 8))
    assert capture_sizes(1024) == capture_sizes(256)            # bigger batches run eagerly
    assert capture_sizes(20) == (1, 2, 4, 8, 16, 20)             # the top is always there
    assert capture_sizes(3) == (1, 2, 3)
    assert capture_sizes(1) == (1,)


def test_a_batch_runs_on_the_smallest_size_that_holds_it():
    sizes = capture_sizes(64)
    assert [bucket(b, sizes) for b in (1, 2, 3, 5, 8, 9, 63, 64)] == [1, 2, 4, 8, 8, 16, 64, 64]
    assert bucket(65, sizes) is None and bucket(0, sizes) is None


def test_cpu_runner_never_builds_graphs(llama_dir):
    runner = ModelRunner(EngineConfig(model=llama_dir, num_kv_blocks=8, max_model_len=64))
    assert runner.graphs is None
    assert EngineConfig.from_strings({"model": llama_dir, "enforce_eager": "true"}).enforce_eager


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_static_buffer_decode_equals_the_eager_step(llama_dir, backend):
    runner = ModelRunner(EngineConfig(model=llama_dir, num_kv_blocks=24, block_size=4, max_model_len=64,
                                      attention_backend=backend))
    lens = (9, 3, 14)
    tables = [[1, 2, 3], [4], [5, 6, 7, 8]]
    prompts = [list(range(10 + i, 10 + i + n)) for i, n in enumerate(lens)]
    runner.execute(SchedulerOutput([ScheduledRequest(f"r{i}", p, 0, [t], True)
                                    for i, (p, t) in enumerate(zip(prompts, tables))]))
    # One decode step; request r1 (a 1-token chunk that does not sample) shows rows are picked, not assumed.
    # No new blocks: the runner keeps the tables the prefill gave it.
    step = SchedulerOutput([ScheduledRequest("r0", [7], 9, [[]], True),
                            ScheduledRequest("r1", [8], 3, [[]], False),
                            ScheduledRequest("r2", [9], 14, [[]], True)])
    eager, ids = runner.execute(step)
    assert ids == ["r0", "r2"]
    before = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    graphs = DecodeGraphs(runner.model, runner.ops, runner.kv_caches, (1, 2, 4, 8), runner.max_model_len,
                          runner.block_size, runner.device, capture=lambda forward: forward)
    input_ids, positions, meta, logits_indices, _ = runner._prepare(step)
    for _ in range(2):  # the second time over buffers the first left behind
        replayed = graphs.run(input_ids, positions, meta, logits_indices)
        torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
    # Padding rows stored nothing: the null block and the unused blocks 9.. are still zero, and the
    # requests' own slots hold what the eager step wrote (up to rounding: a batch of 4, not 3).
    for (k, v), (k0, v0) in zip(runner.kv_caches, before):
        assert not k[0].any() and not v[0].any() and not k[9:].any() and not v[9:].any()
        torch.testing.assert_close((k, v), (k0, v0), rtol=1e-5, atol=1e-5)
    # A bigger batch from an earlier step must not leak into a smaller one.
    small = SchedulerOutput([ScheduledRequest("r0", [7], 9, [[]], True)])
    torch.testing.assert_close(graphs.run(*runner._prepare(small)[:4]), runner.execute(small)[0],
                               rtol=1e-5, atol=1e-5)


def _tensors_in(value, seen: set[int]) -> list[torch.Tensor]:
    """Every tensor reachable from a closure's cells (through functions, metadata and sequences)."""
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return [value]
    if callable(value) and getattr(value, "__closure__", None) is not None:
        found = []
        for cell in value.__closure__:
            found += _tensors_in(cell.cell_contents, seen)
        for default in value.__defaults__ or ():
            found += _tensors_in(default, seen)
        return found
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors_in(item, seen)]
    if hasattr(value, "__dataclass_fields__"):
        return [t for name in value.__dataclass_fields__ for t in _tensors_in(getattr(value, name), seen)]
    return []


def test_every_tensor_a_captured_forward_reads_outlives_start_up(llama_dir):
    """A CUDA graph keeps the addresses of what it read at capture, not references: the graphs must
    hold each such tensor themselves. This capture keeps only weak references, as a real one does."""
    runner = ModelRunner(EngineConfig(model=llama_dir, num_kv_blocks=24, block_size=4, max_model_len=64))
    kept: list[weakref.ref] = []

    def capture(forward):
        forward()
        # A view's memory is its base's: the base is what must live (a view object may be dropped).
        kept.extend(weakref.ref(t if t._base is None else t._base) for t in _tensors_in(forward, set()) if t.numel())
        return lambda: None

    graphs = DecodeGraphs(runner.model, runner.ops, runner.kv_caches, (1, 2, 4), runner.max_model_len,
                          runner.block_size, runner.device, capture=capture)
    gc.collect()
    assert kept and all(ref() is not None for ref in kept), "a tensor the captured forward reads was freed"
    assert graphs.rows.numel() == 4
