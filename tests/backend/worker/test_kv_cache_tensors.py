"""The KV cache's tensors and size on the CPU: lazily backed zeros, the default from the RAM left after
the weights (logged with where it came from), and --kv-cache-memory winning over it."""
from __future__ import annotations

import logging

import pytest
import torch

from kvserve.backend.engine.config import EngineConfig
from kvserve.backend.kv_cache.host_memory import HostMemory
from kvserve.backend.worker import model_runner
from kvserve.backend.worker.kv_cache_tensors import allocate_kv_tensor, resolve_kv_dtype
from kvserve.kernels.kv_quant import byte_rows

MIB = 2 ** 20


def _rss() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float8_e4m3fn])
def test_a_cpu_kv_tensor_reads_zeros_and_takes_memory_only_where_written(dtype):
    before = _rss()
    t = allocate_kv_tensor((4096, 16, 8, 128), dtype, torch.device("cpu"))  # 256 or 64 MiB of address space
    assert t.dtype == dtype and t.shape == (4096, 16, 8, 128)
    assert not byte_rows(t)[::512].any()  # reading maps the kernel's zero page, nothing resident
    byte_rows(t)[7] = 3  # as a store writes one block
    assert byte_rows(t)[7].eq(3).all() and not byte_rows(t)[6].any() and not byte_rows(t)[8].any()
    assert _rss() - before < 16 * MIB


def _mapping_flags(address: int) -> set[str]:
    """The VmFlags of the mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:  # a mapping's first line: "start-end perms ..."
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and head == "VmFlags:":
            return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


def test_a_cpu_kv_tensor_is_private_memory():
    # A shared anonymous mapping (mmap's default) is shmem, whose first write to a page costs more.
    t = allocate_kv_tensor((256, 16, 8, 128), torch.float32, torch.device("cpu"))
    flags = _mapping_flags(t.data_ptr())
    assert "wr" in flags and "sh" not in flags, flags


def test_kv_dtype_names():
    assert resolve_kv_dtype("auto", torch.bfloat16) is torch.bfloat16
    assert resolve_kv_dtype("fp8", torch.float32) is resolve_kv_dtype("fp8_e4m3", torch.float32) is torch.float8_e4m3fn
    assert resolve_kv_dtype("fp8_e5m2", torch.float32) is torch.float8_e5m2


def _runner(llama_dir, **kw):
    return model_runner.ModelRunner(EngineConfig(model=llama_dir, max_num_seqs=4, max_model_len=64, **kw))


BLOCK_BYTES = 16 * 2 * 2 * 2 * 16 * 4  # the tiny model's float32 block: 16 tokens, 2 layers, K and V, 2 heads of 16


def test_cpu_default_is_a_share_of_the_ram_left_and_says_so(llama_dir, monkeypatch, caplog):
    # Half of 20 blocks' worth available: 10 blocks (+ the null block), fewer than the 16 that
    # 4 sequences of 64 tokens would use.
    monkeypatch.setattr(model_runner, "read_host_memory",
                        lambda: HostMemory(total=1 << 34, available=20 * BLOCK_BYTES, source="MemAvailable"))
    with caplog.at_level(logging.INFO, logger="kvserve.engine"):
        runner = _runner(llama_dir)
    assert runner.block_bytes == BLOCK_BYTES and runner.num_blocks == 10 + 1
    assert any("CPU KV cache size:" in r.message and "0.5 x the" in r.message and "(MemAvailable)" in r.message
               for r in caplog.records)
    # Plenty available: every sequence at full length, no more.
    monkeypatch.setattr(model_runner, "read_host_memory",
                        lambda: HostMemory(total=1 << 34, available=1 << 33, source="MemAvailable"))
    assert _runner(llama_dir).num_blocks == 4 * 4 + 1
    # fp8 blocks are a quarter of the bytes: four times as many fit in the same share.
    monkeypatch.setattr(model_runner, "read_host_memory",
                        lambda: HostMemory(total=1 << 34, available=8 * BLOCK_BYTES, source="MemAvailable"))
    assert _runner(llama_dir).num_blocks == 4 + 1
    assert _runner(llama_dir, kv_cache_dtype="fp8").num_blocks == 16 + 1


def test_kv_cache_memory_wins_and_the_host_is_not_asked(llama_dir, monkeypatch):
    def unasked():
        raise AssertionError("read_host_memory called although --kv-cache-memory was given")

    monkeypatch.setattr(model_runner, "read_host_memory", unasked)
    assert _runner(llama_dir, kv_cache_memory=40 * BLOCK_BYTES).num_blocks == 40
    assert _runner(llama_dir, kv_cache_memory=40 * BLOCK_BYTES, kv_cache_dtype="fp8_e5m2").num_blocks == 160
