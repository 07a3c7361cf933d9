"""OS-level names for kvserve's threads, so `top -H`, `ps -L` and
/proc/<pid>/task/<tid>/comm show "kvserve-engine" instead of "python3".

Python (before 3.14) keeps `threading.Thread.name` to itself; a thread calls
`name_this_thread()` first thing to hand its Python name to the OS. Linux truncates a
thread name to 15 bytes. Threads started later by a named thread (torch's
OpenMP workers, for one) inherit its name, so the engine's compute threads
show up as the engine's. Elsewhere than Linux this does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading

_PR_SET_NAME = 15
_libc = None


def name_this_thread() -> None:
    """Give the calling thread its Python name at the OS level (first 15 bytes)."""
    global _libc
    if not sys.platform.startswith("linux"):
        return
    name = threading.current_thread().name
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode("utf-8", "replace")[:15]), 0, 0, 0)
    except (OSError, AttributeError):  # no libc or no prctl: names are a convenience only
        pass
