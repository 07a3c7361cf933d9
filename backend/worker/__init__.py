"""The model runner and what only it uses (CUDA graphs and their buckets, CPU threads, the hot-path
ops): a SchedulerOutput in, logits out. It never decides who runs. The home of the workers and
the executor that split a model over ranks."""
from __future__ import annotations

from kvserve.backend import exports_loader

# Public names -> the module that defines them. Sibling packages import only these names
# (tests/contract/test_import_rules.py), and each loads on first use.
_EXPORTS = {
    "ModelRunner": ".model_runner",
    "WorkerLost": ".parallel.distributed",
}
__all__ = sorted(_EXPORTS)
__getattr__ = exports_loader(__name__, _EXPORTS)
