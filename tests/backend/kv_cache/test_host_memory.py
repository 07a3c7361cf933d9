"""Reading what RAM is left (backend/kv_cache/host_memory.py): /proc/meminfo, and a container's cgroup
limit, v2 or v1, when it leaves less."""
from __future__ import annotations

from pathlib import Path

from kvserve.backend.kv_cache.host_memory import cgroup_headroom, read_host_memory

GIB = 2 ** 30


def _meminfo(tmp_path: Path, total_kb: int, available_kb: int) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {total_kb} kB\nMemFree:         1000 kB\nMemAvailable:   {available_kb} kB\n"
                    "HugePages_Total:       0\n")
    return path


def test_meminfo_without_a_cgroup_limit(tmp_path):
    host = read_host_memory(_meminfo(tmp_path, 24 * 2**20, 13 * 2**20), tmp_path / "no-cgroup")
    assert (host.total, host.available, host.source) == (24 * GIB, 13 * GIB, "MemAvailable")


def test_a_cgroup_v2_limit_wins_when_it_leaves_less(tmp_path):
    root = tmp_path / "cg"
    root.mkdir()
    (root / "memory.max").write_text(f"{8 * GIB}\n")
    (root / "memory.current").write_text(f"{5 * GIB}\n")
    (root / "memory.stat").write_text(f"anon {3 * GIB}\ninactive_file {1 * GIB}\n")
    # 8 GiB limit, 5 used of which 1 is reclaimable file cache: 4 GiB left.
    assert cgroup_headroom(root) == (8 * GIB, 4 * GIB, "cgroup memory.max")
    host = read_host_memory(_meminfo(tmp_path, 24 * 2**20, 13 * 2**20), root)
    assert (host.total, host.available, host.source) == (8 * GIB, 4 * GIB, "cgroup memory.max")
    # No limit ("max"): the host's numbers.
    (root / "memory.max").write_text("max\n")
    assert cgroup_headroom(root) is None


def test_a_cgroup_v1_limit_and_v1s_no_limit(tmp_path):
    root = tmp_path / "cg"
    (root / "memory").mkdir(parents=True)
    (root / "memory" / "memory.usage_in_bytes").write_text(f"{2 * GIB}\n")
    (root / "memory" / "memory.stat").write_text(f"cache 0\ntotal_inactive_file {GIB}\n")
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert cgroup_headroom(root) is None
    (root / "memory" / "memory.limit_in_bytes").write_text(f"{6 * GIB}\n")
    assert cgroup_headroom(root) == (6 * GIB, 5 * GIB, "cgroup memory/memory.limit_in_bytes")
    # A limit that leaves more than the host has available does not raise what is available.
    host = read_host_memory(_meminfo(tmp_path, 24 * 2**20, 3 * 2**20), root)
    assert host.available == 3 * GIB and host.source == "MemAvailable"
