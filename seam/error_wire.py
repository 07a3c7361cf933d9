"""How an error crosses the seam: a kind, the field at fault, a message for the client.

The engine ends a request with a Triton error whose message is
`WireError.format()`::

    [kvserve kind=invalid param=max_tokens] max_tokens: must be an integer >= 1, got 0
    '--------------- header ---------------' '------------ message ------------'

and the gateway reads kind and param back with `WireError.parse()` instead of
guessing them from the English text. The header is searched for, not matched at
the start: a server may wrap the model's message in its own words.
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class ErrorKind(enum.Enum):
    INVALID = "invalid"                          # a bad value; `param` names the field (HTTP 400)
    CONTEXT_LENGTH = "context_length_exceeded"   # prompt (+ max_tokens) longer than the context (400)
    OVERLOADED = "overloaded"                    # the waiting queue is full: retry later, or elsewhere (503)
    SHUTDOWN = "shutdown"                        # the engine is closing: retry elsewhere (503)
    TIMEOUT = "timeout"                          # the request's own `timeout` ran out (408)
    NOT_FOUND = "not_found"                      # no such model or LoRA adapter (404 model_not_found)
    INTERNAL = "internal"                        # the engine failed (500)

    @property
    def retryable(self) -> bool:
        """Another replica may take the request as it is."""
        return self in (ErrorKind.OVERLOADED, ErrorKind.SHUTDOWN)


# A param is a field name (or a dotted path): anything else, e.g. a client's
# unknown key, is not repeated in the header.
_PARAM = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,63}")
_HEADER = re.compile(r"\[kvserve kind=([a-z_]+)(?: param=(" + _PARAM.pattern + r"))?\] ")
_KINDS = {k.value: k for k in ErrorKind}


@dataclass(frozen=True, slots=True)
class WireError:
    kind: ErrorKind
    message: str
    param: str | None = None

    def format(self) -> str:
        param = f" param={self.param}" if self.param and _PARAM.fullmatch(self.param) else ""
        return f"[kvserve kind={self.kind.value}{param}] {self.message}"

    @classmethod
    def parse(cls, text: str) -> "WireError | None":
        """The error in a backend's message, or None when it carries no header
        (it came from the server itself, not from the engine)."""
        match = _HEADER.search(text)
        if match is None:
            return None
        kind = _KINDS.get(match.group(1), ErrorKind.INTERNAL)  # a newer engine's kind: not the client's fault
        return cls(kind, text[match.end():], match.group(2))


class RequestError(ValueError):
    """A request the engine refuses: a ValueError (as DESIGN promises for bad
    sampling values) that also knows its kind and the field at fault."""

    def __init__(self, message: str, param: str | None = None, kind: ErrorKind = ErrorKind.INVALID) -> None:
        super().__init__(message)
        self.param = param
        self.kind = kind

    def wire(self) -> WireError:
        return WireError(self.kind, str(self), self.param)


def invalid(param: str, detail: str) -> RequestError:
    """`param: detail`, the engine's message for a bad field (the client sees it as is)."""
    return RequestError(f"{param}: {detail}", param)
