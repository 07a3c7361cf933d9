"""How much RAM this process may still use: what the CPU KV cache's default size is a share of.

Linux's MemAvailable (/proc/meminfo) is the kernel's estimate of what can be allocated without
swapping (free memory plus the page cache it can drop). In a container that number is the host's,
so a cgroup's limit is read too (v2 `memory.max`, v1 `memory.limit_in_bytes`, as the container sees
its own cgroup at the mount's root), and its headroom wins when it is smaller: its usage less the
inactive file cache the kernel would reclaim before failing an allocation. Reading only, no torch:
the arithmetic on the result is kv_budget.py's.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_CGROUP = Path("/sys/fs/cgroup")


@dataclass(frozen=True, slots=True)
class HostMemory:
    total: int        # bytes of RAM (or of the cgroup's limit, when lower)
    available: int    # bytes that can still be allocated without swapping
    source: str       # where `available` came from, for the start-up log


def _meminfo(path: Path = Path("/proc/meminfo")) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[name] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # v2 writes "max" for no limit


def _inactive_file(stat: Path) -> int:
    try:
        for line in stat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name in ("inactive_file", "total_inactive_file") and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


def cgroup_headroom(root: Path = _CGROUP) -> tuple[int, int, str] | None:
    """(limit, bytes left under it, which file) of this process's cgroup, or None without a limit."""
    for limit_file, usage_file, stat_file in (("memory.max", "memory.current", "memory.stat"),
                                              ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes",
                                               "memory/memory.stat")):
        limit, usage = _read_int(root / limit_file), _read_int(root / usage_file)
        # v1 reports "no limit" as a huge number (2^63 rounded down to a page).
        if limit is None or usage is None or limit >= 1 << 60:
            continue
        used = max(0, usage - _inactive_file(root / stat_file))
        return limit, max(0, limit - used), f"cgroup {limit_file}"
    return None


def read_host_memory(meminfo: Path = Path("/proc/meminfo"), cgroup_root: Path = _CGROUP) -> HostMemory | None:
    """This machine's RAM and what is left of it, or None where neither /proc/meminfo nor sysconf tells."""
    try:
        info = _meminfo(meminfo)
        total, available, source = info["MemTotal"], info["MemAvailable"], "MemAvailable"
    except (OSError, KeyError):
        try:  # no /proc (not Linux): free pages only, the page cache not counted
            page = os.sysconf("SC_PAGE_SIZE")
            total, available = os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page
            source = "free pages (sysconf)"
        except (ValueError, OSError, AttributeError):
            return None
    limit = cgroup_headroom(cgroup_root)
    if limit is not None and limit[1] < available:
        total, available, source = min(total, limit[0]), limit[1], limit[2]
    return HostMemory(total=total, available=available, source=source)
