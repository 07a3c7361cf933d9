"""Load shapes for the locustfile, as pure functions of elapsed time.

Kept apart from locust (which monkey-patches the standard library with gevent
on import) so the shapes can be unit-tested and reused. Each returns
(users, spawn_rate) for the current second, or None to stop the test.

    steady: `users` from the start until `duration`.
    ramp:   1 -> `users` linearly over the first 80% of `duration`, then hold;
            where TTFT starts to climb is the server's knee.
    spike:  `users` baseline, jumping to `spike_users` for `spike_len` seconds
            at `spike_at`; shows queueing and how fast the server recovers.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Mapping

Tick = tuple[int, float] | None


@dataclass(frozen=True, slots=True)
class ShapeConfig:
    users: int = 8
    spawn_rate: float = 4.0
    duration: float = 60.0
    spike_users: int = 32
    spike_at: float = 20.0
    spike_len: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "ShapeConfig":
        d = cls()

        def get(name: str, default: float) -> float:
            return float(env.get(f"KVSERVE_{name}", default))

        return cls(
            users=int(get("USERS", d.users)),
            spawn_rate=get("SPAWN_RATE", d.spawn_rate),
            duration=get("DURATION", d.duration),
            spike_users=int(get("SPIKE_USERS", d.spike_users)),
            spike_at=get("SPIKE_AT", d.spike_at),
            spike_len=get("SPIKE_LEN", d.spike_len),
        )


def steady(t: float, c: ShapeConfig) -> Tick:
    return None if t >= c.duration else (c.users, c.spawn_rate)


def ramp(t: float, c: ShapeConfig) -> Tick:
    if t >= c.duration:
        return None
    frac = min(1.0, t / (0.8 * c.duration))
    # Spawn fast enough that each step is reached at once; the shape sets the pace.
    return (max(1, math.ceil(c.users * frac)), max(c.spawn_rate, float(c.users)))


def spike(t: float, c: ShapeConfig) -> Tick:
    if t >= c.duration:
        return None
    if c.spike_at <= t < c.spike_at + c.spike_len:
        # Everyone at once: that is what makes it a spike.
        return (c.spike_users, float(c.spike_users))
    return (c.users, max(c.spawn_rate, float(c.spike_users)))


SHAPES: dict[str, Callable[[float, ShapeConfig], Tick]] = {"steady": steady, "ramp": ramp, "spike": spike}


def selected_shape(env: Mapping[str, str] = os.environ) -> Callable[[float, ShapeConfig], Tick] | None:
    """The shape named by $KVSERVE_LOAD_SHAPE; None (plain -u/-r) when unset."""
    name = env.get("KVSERVE_LOAD_SHAPE", "").strip().lower()
    if not name:
        return None
    if name not in SHAPES:
        raise ValueError(f"KVSERVE_LOAD_SHAPE must be one of {', '.join(SHAPES)}, got {name!r}")
    return SHAPES[name]
