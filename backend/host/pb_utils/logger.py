"""pb_utils.Logger: Triton's static logging API routed to Python logging.

Records carry the model's own file and line (as Triton's log lines do), not this
module's, so `--log-level` filters them like any host message.
"""
from __future__ import annotations

import enum
import logging
import sys

_LOG = logging.getLogger("kvserve.host.model")


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_TO_PY = {
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.VERBOSE: logging.DEBUG,
}


def _emit(message: str, level: LogLevel) -> None:
    py_level = _TO_PY[LogLevel(level)]
    if not _LOG.isEnabledFor(py_level):
        return
    # Two frames up is the model code that called Logger.log_*/log.
    frame = sys._getframe(2)
    record = _LOG.makeRecord(
        _LOG.name, py_level, frame.f_code.co_filename, frame.f_lineno, str(message), None, None,
        func=frame.f_code.co_name,
    )
    _LOG.handle(record)


class Logger:
    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        _emit(message, level)

    @staticmethod
    def log_info(message: str) -> None:
        _emit(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        _emit(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        _emit(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        _emit(message, LogLevel.VERBOSE)
