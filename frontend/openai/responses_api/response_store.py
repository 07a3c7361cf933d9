"""Stored responses, for `previous_response_id` and GET / DELETE /v1/responses/{id}: a bounded LRU
in the gateway's memory, kept per API key.

Each entry belongs to the key that created it (its digest; "" when the server has no keys): an id
asked for under another key is not found, the same answer as for an id that never existed, so
nothing tells one key whether another's ids are real. The store is bounded by entries and by bytes
(the JSON size of the response and of its conversation); the least recently used go first.
Memory only: a restart forgets them, as does --disable-response-store (then nothing is kept).
"""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from aiohttp import web

DEFAULT_MAX_ENTRIES = 1024
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


@dataclass(slots=True, frozen=True)
class StoredResponse:
    body: dict[str, Any]  # the Response object, as GET returns it
    conversation: list[dict[str, Any]]  # chat messages up to and including its answer (no instructions)
    size: int


class ResponseStore:
    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[tuple[str, str], StoredResponse] = OrderedDict()
        self._bytes = 0

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, owner: str, body: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        if not self.enabled:
            return
        size = len(json.dumps(body, ensure_ascii=False)) + len(json.dumps(conversation, ensure_ascii=False))
        if size > self.max_bytes:
            return  # larger than the whole store: not kept (previous_response_id to it is a 404)
        key = (owner, body["id"])
        self._drop(key)
        self._entries[key] = StoredResponse(body, conversation, size)
        self._bytes += size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def get(self, owner: str, response_id: str) -> StoredResponse | None:
        entry = self._entries.get((owner, response_id))
        if entry is not None:
            self._entries.move_to_end((owner, response_id))
        return entry

    def delete(self, owner: str, response_id: str) -> bool:
        return self._drop((owner, response_id))

    def _drop(self, key: tuple[str, str]) -> bool:
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self._bytes -= entry.size
        return True


RESPONSE_STORE: web.AppKey[ResponseStore] = web.AppKey("kvserve_response_store", ResponseStore)
