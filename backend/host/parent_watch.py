"""`--parent-pid`: a host started by a CLI must never outlive it.

Two mechanisms, because each misses a case: PR_SET_PDEATHSIG makes the kernel
signal us the moment our parent exits (only for the real parent, and only on
Linux); polling the given pid also covers a pid that is not our parent and
other platforms. Caveat of PR_SET_PDEATHSIG: "parent" means the thread that
spawned us, so a CLI should start the host from a thread that lives as long as
it does (its main thread); the poll is the backstop either way.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import signal
import sys
from typing import Callable

_LOG = logging.getLogger("kvserve.host")
PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    # A killed process nobody has reaped yet is a zombie: it is dead for our purpose.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


async def watch_parent(pid: int, on_exit: Callable[[], None], interval: float = 0.5) -> None:
    """Calls on_exit once, when `pid` is gone (or when we were re-parented away from it)."""
    if pid == os.getppid():
        set_parent_death_signal(signal.SIGTERM)
    while True:
        # getppid() changing means our parent died between fork and prctl, or since.
        if not process_alive(pid) or (pid != os.getppid() and pid == _initial_ppid):
            _LOG.warning("parent process %d is gone: shutting down", pid)
            on_exit()
            return
        await asyncio.sleep(interval)


_initial_ppid = os.getppid()
