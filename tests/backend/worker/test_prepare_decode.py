"""The runner's inputs for a step of one token per request (ModelRunner._prepare_decode, built from
Python ints) are the general path's tensors exactly: same values, dtypes and metadata, for one KV
group and for a model with sliding-window layers (several groups, a table each)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from kvserve.backend.engine.config import EngineConfig
from kvserve.backend.engine.scheduler import ScheduledRequest, SchedulerOutput
from kvserve.backend.models.tiny import TinySpec, make_tiny_model
from kvserve.backend.worker.model_runner import ModelRunner
from tests.conftest import MODEL_CACHE

GEMMA3 = TinySpec(arch="gemma3", num_layers=3, num_heads=4, num_kv_heads=1, head_dim=32, sliding_window=8, seed=33)


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), (a, b)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name))
    else:
        assert a == b


def _decode_step(runner: ModelRunner) -> SchedulerOutput:
    """Three requests at different positions, with tables of different lengths (one of them ending
    where its last token starts a block), and one row that does not sample (a prompt's last chunk
    of one token before the known end)."""
    groups = len(runner.kv_groups)
    positions = {"a": 5, "b": 31, "c": 16}
    scheduled, next_block = [], 1
    for rid, pos in positions.items():
        blocks = pos // runner.block_size + 1
        runner.block_tables[rid] = [list(range(next_block + g * 50, next_block + g * 50 + blocks))
                                    for g in range(groups)]
        next_block += blocks
        scheduled.append(ScheduledRequest(rid, [100 + pos], pos, [[] for _ in range(groups)], samples=rid != "c"))
    return SchedulerOutput(scheduled=scheduled)


@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_decode_inputs_are_the_general_paths(model, llama_dir):
    model_dir = llama_dir if model == "llama" else str(make_tiny_model(MODEL_CACHE / "prepare-decode-gemma3", GEMMA3))
    runner = ModelRunner(EngineConfig(model=model_dir, num_kv_blocks=256, block_size=4, max_model_len=64))
    out = _decode_step(runner)
    fast = runner._prepare_decode(out.scheduled)
    assert (len(runner.kv_groups) > 1) == (model == "gemma3")
    _same(fast, runner._prepare_general(out.scheduled))
    assert fast[4] == ["a", "b"] and fast[3].tolist() == [0, 1]  # the rows that sample, and their logits rows
    runner._prepare_general = None  # a step of one token per request never reaches the general path
    _same(runner._prepare(out), fast)
