"""Structured log lines without importing structlog: what the edge agent logs with.

structlog (with its json, tracebacks and console modules) is about 1.1 MB resident,
which an idle agent holds for months (benchmarks/RESULTS.md, issue 28, fifth round). The
agent's modules, and the shared plumbing it runs (shared/mqtt.py, shared/runtime.py),
log through `get_logger` here: a logger with structlog's calls (`bind`, `info(event,
**fields)`, `exception`, ...) that decides at each call who writes the line.

- Where `shared.logs.configure_logging` configured logging (the control plane, the
  simulator, `greenfed edge run` at a terminal), or nothing did (tests, one-shot
  commands), each call is handed to structlog as it always was: the same processors,
  the same lines, and `structlog.testing.capture_logs` sees them.
- Where `configure_json_lines` did (an agent whose log is not a terminal: systemd, a
  container, the upgrade supervisor's pipe), structlog is never imported and each line
  is rendered here as shared/logs.py's structlog configuration renders JSON: the same
  keys in the same order (bound fields, the call's fields, `event`, the context bound
  with `bind_contextvars`, `level`, `timestamp`, `exception`), secrets masked by
  `shared.redact`, stdlib records (paho, asyncio) as the same lines with their extras.
  tests/shared/test_lean_logs.py holds the two renderings to each other, line by line.
"""

from __future__ import annotations

import contextvars
import io
import json
import logging
import sys
import traceback
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol, TextIO

from shared.redact import redact

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
# Third-party libraries are chatty at INFO; their warnings still come through.
NOISY_LOGGERS = ("amqtt", "transitions", "aiohttp.access", "asyncio")


class EventLogger(Protocol):
    """What the agent's modules call on a logger: this module's `Logger`, or structlog's
    (the control plane hands its own to shared/mqtt.py)."""

    def bind(self, **fields: Any) -> EventLogger: ...
    def debug(self, event: str, /, **fields: Any) -> Any: ...
    def info(self, event: str, /, **fields: Any) -> Any: ...
    def warning(self, event: str, /, **fields: Any) -> Any: ...
    def error(self, event: str, /, **fields: Any) -> Any: ...
    def exception(self, event: str, /, **fields: Any) -> Any: ...


class _JsonLines:
    """What `configure_json_lines` set: the level below which calls are dropped."""

    def __init__(self, level: int) -> None:
        self.level = level


# Process-wide, as logging's own configuration (and structlog's) is: None while lines go
# through structlog.
_json_lines: _JsonLines | None = None
_bound: dict[str, contextvars.ContextVar[Any]] = {}


class Logger:
    """A named logger with bound fields; structlog's `BoundLogger` calls, rendered by
    whoever `_json_lines` says at the time of each call."""

    __slots__ = ("_context", "_name")

    def __init__(self, name: str, context: dict[str, Any] | None = None) -> None:
        self._name = name
        self._context = context or {}

    def bind(self, **fields: Any) -> Logger:
        return Logger(self._name, {**self._context, **fields})

    def debug(self, event: str, /, **fields: Any) -> None:
        self._log("debug", event, fields)

    def info(self, event: str, /, **fields: Any) -> None:
        self._log("info", event, fields)

    def warning(self, event: str, /, **fields: Any) -> None:
        self._log("warning", event, fields)

    def error(self, event: str, /, **fields: Any) -> None:
        self._log("error", event, fields)

    def critical(self, event: str, /, **fields: Any) -> None:
        self._log("critical", event, fields)

    def exception(self, event: str, /, **fields: Any) -> None:
        """An error with the exception being handled (structlog's `exception`)."""
        self._log("exception", event, fields)

    def _log(self, method: str, event: str, fields: dict[str, Any]) -> None:
        json_lines = _json_lines
        if json_lines is None:
            import structlog

            bound = structlog.get_logger(self._name, **self._context)
            getattr(bound, method)(event, **fields)
            return
        if method == "exception":
            method = "error"
            fields.setdefault("exc_info", True)
        level = LEVELS[method]
        if level < json_lines.level:
            return
        event_dict = _EventDict(self._context)
        event_dict.update(fields)
        event_dict["event"] = event
        _merge_bound_context(event_dict)
        event_dict["level"] = method
        event_dict["timestamp"] = _timestamp()
        exc_info = _exc_info(event_dict.pop("exc_info", None))
        if exc_info is not None:
            event_dict["exception"] = _format_exception(exc_info)
        logging.getLogger(self._name).log(level, event_dict)


def get_logger(name: str) -> Logger:
    return Logger(name)


def bind_contextvars(**fields: Any) -> None:
    """Context that rides along on every line logged in this task from now on
    (structlog's `contextvars.bind_contextvars`, whose context it is while structlog
    writes the lines)."""
    if _json_lines is None:
        import structlog

        structlog.contextvars.bind_contextvars(**fields)
        return
    for key, value in fields.items():
        variable = _bound.get(key)
        if variable is None:
            variable = _bound[key] = contextvars.ContextVar(f"greenfed_log_{key}", default=...)
        variable.set(value)


def configure_json_lines(level: str = "info", stream: TextIO | None = None) -> None:
    """Our calls and stdlib records alike as JSON lines on `stream`, without structlog."""
    global _json_lines
    numeric_level = LEVELS[level]
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    route_stdlib_logging(handler, numeric_level)
    _json_lines = _JsonLines(numeric_level)


def use_structlog() -> None:
    """Hand every call to structlog again (shared.logs.configure_logging calls this)."""
    global _json_lines
    _json_lines = None


def route_stdlib_logging(handler: logging.Handler, numeric_level: int) -> None:
    """Every record through `handler` alone, at `numeric_level`; the noisy libraries'
    only from warnings up."""
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric_level)
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(max(numeric_level, logging.WARNING))


class _EventDict(dict[str, Any]):
    """A line built by `Logger` (as structlog's `wrap_for_formatter` hands its dict on)."""


# What a stdlib record has of its own; anything else on it is an `extra` field, as
# structlog's `ExtraAdder` sees it.
_RECORD_ATTRIBUTES = frozenset(
    logging.LogRecord("name", 0, "pathname", 0, "msg", (), None).__dict__
)


class JsonLineFormatter(logging.Formatter):
    """One JSON object per record, as shared/logs.py's structlog `ProcessorFormatter`
    with `JSONRenderer` writes it."""

    def format(self, record: logging.LogRecord) -> str:
        if isinstance(record.msg, _EventDict):
            event_dict: dict[str, Any] = dict(record.msg)
        else:
            event_dict = _foreign_event(record)
        redacted = redact(event_dict)
        return json.dumps(redacted, default=_json_fallback)


def _foreign_event(record: logging.LogRecord) -> dict[str, Any]:
    """A stdlib record's line (structlog's `foreign_pre_chain` in shared/logs.py)."""
    event_dict: dict[str, Any] = {"event": record.getMessage()}
    if record.exc_info:
        event_dict["exc_info"] = record.exc_info
    if record.stack_info:
        event_dict["stack_info"] = record.stack_info
    _merge_bound_context(event_dict)
    level = record.levelname.lower()
    event_dict["level"] = {"warn": "warning", "exception": "error"}.get(level, level)
    event_dict["timestamp"] = _timestamp()
    for key, value in record.__dict__.items():
        if key not in _RECORD_ATTRIBUTES:
            event_dict[key] = value
    return event_dict


def _merge_bound_context(event_dict: dict[str, Any]) -> None:
    for key, variable in tuple(_bound.items()):
        value = variable.get()
        if value is not ...:
            event_dict.setdefault(key, value)


def _timestamp() -> str:
    return datetime.now(tz=UTC).isoformat().replace("+00:00", "Z")


_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def _exc_info(value: object) -> _ExcInfo | None:
    """`exc_info=` as structlog reads it: an exception, a `sys.exc_info()` tuple, or
    anything true for the exception being handled."""
    if isinstance(value, BaseException):
        return (value.__class__, value, value.__traceback__)
    if isinstance(value, tuple) and len(value) == 3:
        kind, error, trace = value
        if (
            isinstance(kind, type)
            and issubclass(kind, BaseException)
            and isinstance(error, BaseException)
            and (trace is None or isinstance(trace, TracebackType))
        ):
            return (kind, error, trace)
    if value:
        current = sys.exc_info()
        if current[0] is None or current[1] is None:
            return None
        return (current[0], current[1], current[2])
    return None


def _format_exception(exc_info: _ExcInfo) -> str:
    text = io.StringIO()
    traceback.print_exception(exc_info[0], exc_info[1], exc_info[2], None, text)
    return text.getvalue().removesuffix("\n")


def _json_fallback(value: object) -> object:
    """What JSON cannot hold, as structlog's `JSONRenderer` writes it."""
    try:
        return value.__structlog__()  # type: ignore[attr-defined]
    except AttributeError:
        return repr(value)
