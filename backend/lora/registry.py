"""The engine's adapters: which names are registered, the CPU cache of loaded ones, and the pins
that keep an adapter's weights alive while a request runs with it.

Thread-safe (one lock): the Triton model's threads add, remove and resolve adapters while the
engine thread pins and reads them. Reading and checking the files happens outside the lock.

- registered: name -> LoRARequest (ids unique among them);
- cached: up to max_cpu_loras loaded adapters, least recently used first, dropped when over;
- pinned: lora_int_id -> (adapter, count of in-flight requests). A pinned adapter is never
  dropped, not even by remove(): requests already running with it finish with it, and new ones
  can no longer name it.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

from kvserve.backend.lora.lora_request import LoRAError, LoRARequest

Loader = Callable[[LoRARequest], object]  # LoRARequest -> LoRAAdapter (adapter.load_adapter, bound)


class LoRARegistry:
    def __init__(self, loader: Loader, max_cpu_loras: int) -> None:
        self._load = loader
        self._capacity = max_cpu_loras
        self._lock = threading.Lock()
        self._registered: dict[str, LoRARequest] = {}
        self._cache: OrderedDict[int, object] = OrderedDict()
        self._pinned: dict[int, list] = {}  # id -> [adapter, count]

    def add(self, lora: LoRARequest) -> bool:
        """Register `lora` (reading and checking its files); False if it was registered already
        with the same id and path. LoRAError names what is wrong otherwise."""
        with self._lock:
            if self._conflict(lora):
                return False
        adapter = self._load(lora)  # off the lock: files are read and checked here
        with self._lock:
            if self._conflict(lora):
                return False
            self._registered[lora.lora_name] = lora
            self._put(lora.lora_int_id, adapter)
        return True

    def _conflict(self, lora: LoRARequest) -> bool:
        """True for a no-op repeat; raises for a name or id already taken by another adapter."""
        same = self._registered.get(lora.lora_name)
        if same is not None:
            if same == lora:
                return True
            raise LoRAError(f"adapter {lora.lora_name!r} is already loaded from {same.lora_path} "
                            f"(id {same.lora_int_id}); unload it first")
        for other in self._registered.values():
            if other.lora_int_id == lora.lora_int_id:
                raise LoRAError(f"lora_int_id {lora.lora_int_id} is already used by adapter {other.lora_name!r}")
        return False

    def _put(self, lora_id: int, adapter: object) -> None:
        self._cache[lora_id] = adapter
        self._cache.move_to_end(lora_id)
        while len(self._cache) > self._capacity:
            self._cache.popitem(last=False)  # a pinned one lives on in _pinned

    def remove(self, name: str) -> LoRARequest:
        with self._lock:
            lora = self._registered.pop(name, None)
            if lora is None:
                raise LoRAError(f"adapter {name!r} is not loaded", not_found=True)
            self._cache.pop(lora.lora_int_id, None)
            return lora

    def resolve(self, name: str) -> LoRARequest:
        with self._lock:
            lora = self._registered.get(name)
        if lora is None:
            raise LoRAError(f"adapter {name!r} is not loaded", not_found=True)
        return lora

    def list(self) -> list[LoRARequest]:
        with self._lock:
            return list(self._registered.values())

    def pin(self, lora: LoRARequest) -> None:
        """A request will run with `lora`: keep its weights until `unpin`. The adapter must be
        registered as given; a cache miss reads its files again (this thread)."""
        with self._lock:
            if self._registered.get(lora.lora_name) != lora:
                raise LoRAError(f"adapter {lora.lora_name!r} is not loaded", not_found=True)
            held = self._pinned.get(lora.lora_int_id)
            if held is not None:
                held[1] += 1
                return
            adapter = self._cache.get(lora.lora_int_id)
            if adapter is not None:
                self._cache.move_to_end(lora.lora_int_id)
        if adapter is None:
            adapter = self._load(lora)
        with self._lock:
            held = self._pinned.get(lora.lora_int_id)
            if held is not None:
                held[1] += 1
            else:
                self._pinned[lora.lora_int_id] = [adapter, 1]
                if lora.lora_name in self._registered:
                    self._put(lora.lora_int_id, adapter)

    def unpin(self, lora_id: int) -> None:
        with self._lock:
            held = self._pinned.get(lora_id)
            if held is None:
                return
            held[1] -= 1
            if held[1] <= 0:
                del self._pinned[lora_id]

    def pinned(self, lora_id: int) -> object:
        """The weights of an adapter some request holds (the runner's lookup)."""
        with self._lock:
            return self._pinned[lora_id][0]

    def num_pinned(self) -> int:
        with self._lock:
            return len(self._pinned)
