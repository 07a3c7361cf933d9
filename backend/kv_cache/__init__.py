"""The paged KV cache's bookkeeping, pure Python: the block pool, the prefix hash chain, the KV manager
that hands out and frees a request's blocks, and the arithmetic of how many blocks fit."""
from __future__ import annotations

from kvserve.backend import exports_loader

# Public names -> the module that defines them. Sibling packages import only these names
# (tests/contract/test_import_rules.py), and each loads on first use.
_EXPORTS = {
    "CpuKVBudget": ".kv_budget",
    "CudaMemoryProfile": ".kv_budget",
    "HostMemory": ".host_memory",
    "KVCacheGroup": ".kv_groups",
    "KVCacheManager": ".manager",
    "blocks_for_request": ".kv_groups",
    "cpu_kv_budget": ".kv_budget",
    "layer_slots": ".kv_groups",
    "plan_groups": ".kv_groups",
    "describe": ".kv_budget",
    "extra_key": ".block_hash",
    "kv_budget_bytes": ".kv_budget",
    "profile_query_lens": ".kv_budget",
    "read_host_memory": ".host_memory",
}
__all__ = sorted(_EXPORTS)
__getattr__ = exports_loader(__name__, _EXPORTS)
