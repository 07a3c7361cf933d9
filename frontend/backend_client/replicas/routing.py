"""Which replica gets a request: prefix affinity first, least loaded otherwise.

Pure policy over plain numbers (no I/O, no asyncio), so it is unit-testable
and the same on every gateway.

Affinity: requests whose first full prompt block is the same should reach the
same replica, whose prefix cache then already holds it. Rendezvous (highest
random weight) hashing picks that replica from the key and the replica names
alone: every gateway replica agrees without talking to the others, and when a
replica leaves only its own keys move (to each key's second choice).

Affinity yields to load: when the preferred replica has more than
`load_factor * min + load_slack` requests outstanding, where `min` is the least
loaded candidate's count, the request goes to the least loaded one instead. A
hot prefix (one system prompt shared by all traffic) therefore fills one
replica up to that bound and spills over, rather than queueing on it alone.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol, Sequence, TypeVar

AFFINITY = "affinity"
LEAST_LOADED = "least_loaded"
RETRY = "retry"
DECISIONS = (AFFINITY, LEAST_LOADED, RETRY)


class Candidate(Protocol):
    name: str
    outstanding: int  # requests this gateway has in flight there
    routed: int  # requests ever routed there: breaks ties so idle replicas take turns


C = TypeVar("C", bound=Candidate)


@dataclass(slots=True, frozen=True)
class RoutingPolicy:
    prefix_affinity: bool = True
    load_factor: float = 2.0
    load_slack: int = 4

    def __post_init__(self) -> None:
        if self.load_factor < 1.0:
            raise ValueError(f"affinity load factor must be >= 1, got {self.load_factor}")
        if self.load_slack < 0:
            raise ValueError(f"affinity load slack must be >= 0, got {self.load_slack}")

    def too_busy(self, outstanding: int, least: int) -> bool:
        return outstanding > self.load_factor * least + self.load_slack


def rendezvous_weight(key: bytes, name: str) -> int:
    digest = hashlib.blake2b(name.encode() + b"\0" + key, digest_size=8, person=b"kvserve-rdv").digest()
    return int.from_bytes(digest, "big")


def rendezvous_order(key: bytes, names: Sequence[str]) -> list[str]:
    """Names from most to least preferred for this key."""
    return sorted(names, key=lambda n: (rendezvous_weight(key, n), n), reverse=True)


def least_loaded(candidates: Sequence[C]) -> C:
    return min(candidates, key=lambda c: (c.outstanding, c.routed, c.name))


def choose(candidates: Sequence[C], key: bytes | None, policy: RoutingPolicy, *, retry: bool = False) -> tuple[C, str]:
    """The replica for one attempt and the decision label for the metrics.

    `candidates` are the replicas this attempt may use (ready, not yet tried);
    a retry follows the same rules and is labelled `retry`."""
    if not candidates:
        raise ValueError("no candidate replica")
    least = least_loaded(candidates)
    chosen, decision = least, LEAST_LOADED
    if key is not None and policy.prefix_affinity:
        preferred = max(candidates, key=lambda c: (rendezvous_weight(key, c.name), c.name))
        if not policy.too_busy(preferred.outstanding, least.outstanding):
            chosen, decision = preferred, AFFINITY
    return chosen, (RETRY if retry else decision)
