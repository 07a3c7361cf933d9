"""What rank 0 sends its workers, as JSON: the engine config at start, then each step's message.

JSON, not Python's object serialization: the workers read these bytes from a TCP store and a
process group, and loading Python objects from a socket would run whatever code a peer on that
port sent (tests/reliability/test_security.py bans those serializers from the source). Every field is a number, a
string, a list or a dict of them, so the dataclasses are rebuilt field by field.
"""
from __future__ import annotations

import dataclasses
import json

from kvserve.backend.engine import DebugConfig, EngineConfig, ScheduledRequest, SchedulerOutput


def encode_config(config: EngineConfig) -> bytes:
    return json.dumps(dataclasses.asdict(config)).encode()


def decode_config(data: bytes, **changes) -> EngineConfig:
    """The config rank 0 sent, with `changes` (a node's own model path, say) applied before it is checked."""
    fields = json.loads(data)
    fields["debug"] = DebugConfig(**fields["debug"])
    return EngineConfig(**{**fields, **changes})


def encode_message(message: tuple[str, SchedulerOutput | None] | None) -> bytes:
    """A step message (kind, SchedulerOutput or None), or None: stop."""
    if message is None:
        return b"null"
    kind, out = message
    return json.dumps([kind, None if out is None else dataclasses.asdict(out)]).encode()


def decode_message(data: bytes) -> tuple[str, SchedulerOutput | None] | None:
    message = json.loads(data)
    if message is None:
        return None
    kind, out = message
    if out is not None:
        out = SchedulerOutput(scheduled=[ScheduledRequest(**s) for s in out["scheduled"]],
                              new_request_ids=out["new_request_ids"],
                              preempted_request_ids=out["preempted_request_ids"],
                              finished_request_ids=out["finished_request_ids"])
    return kind, out
