"""TritonError (a value carried by a response) and TritonModelException (raised).

TritonError is deliberately not an Exception: in Triton it is a plain object put
into `InferenceResponse(error=...)`, and models that `raise` it would break there.
"""
from __future__ import annotations


class TritonModelException(Exception):
    """Raised by pb_utils calls that fail (send after FINAL, bad flags, ...)."""


class TritonError:
    # TRITONSERVER_Error_Code values; Triton exposes them as class attributes.
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    __slots__ = ("_message", "_code")

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        if message is None:
            raise TypeError("TritonError message must not be None")
        if code is None or int(code) not in _CODE_NAMES:
            raise TypeError(f"invalid TritonError code: {code!r}")
        self._message = str(message)
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {_CODE_NAMES[self._code]})"


_CODE_NAMES = {
    TritonError.UNKNOWN: "UNKNOWN",
    TritonError.INTERNAL: "INTERNAL",
    TritonError.NOT_FOUND: "NOT_FOUND",
    TritonError.INVALID_ARG: "INVALID_ARG",
    TritonError.UNAVAILABLE: "UNAVAILABLE",
    TritonError.UNSUPPORTED: "UNSUPPORTED",
    TritonError.ALREADY_EXISTS: "ALREADY_EXISTS",
    TritonError.CANCELLED: "CANCELLED",
}
