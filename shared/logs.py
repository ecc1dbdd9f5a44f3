"""structlog setup: JSON lines for machines, a readable console for people.

Context (node_id, job_id) is bound once with `structlog.contextvars` and rides
along on every line logged inside that task. Every line, ours and the libraries',
passes `redact_secrets` last before it is rendered: URL passwords and the values of
secret-named keys (shared/redact.py) never reach the output.

structlog is imported where logging is configured, not with this module: the edge agent
(which imports `RateLimitedLog`) writes its JSON lines without it (shared/lean_logs.py,
`configure_agent_logging`).
"""

from __future__ import annotations

import io
import logging
import sys
import time
from typing import TYPE_CHECKING, Literal, TextIO

from shared import lean_logs
from shared.redact import redact, redact_text

if TYPE_CHECKING:
    import structlog

    from shared.lean_logs import EventLogger

LogFormat = Literal["auto", "json", "console"]


def writes_json(log_format: LogFormat, stream: TextIO) -> bool:
    """JSON when asked for, or for `auto` where no person reads the stream."""
    return log_format == "json" or (log_format == "auto" and not stream.isatty())


def redact_secrets(
    _logger: object, _method: str, event_dict: structlog.types.EventDict
) -> structlog.types.EventDict:
    """structlog processor: mask secrets anywhere in the event (shared/redact.py)."""
    redacted = redact(event_dict)
    assert isinstance(redacted, dict)
    return redacted


def _redacted_traceback(sio: TextIO, exc_info: structlog.typing.ExcInfo) -> None:
    """The console's traceback, with what `redact_text` masks masked (an exception's
    message may carry a URL with its password)."""
    import structlog

    plain = io.StringIO()
    structlog.dev.plain_traceback(plain, exc_info)
    sio.write(redact_text(plain.getvalue()))


def configure_logging(
    level: str = "info", log_format: LogFormat = "auto", stream: TextIO | None = None
) -> None:
    """Configure structlog and route stdlib logging (aiohttp, amqtt) through the same renderer."""
    import structlog

    stream = stream or sys.stderr
    use_json = writes_json(log_format, stream)
    numeric_level = lean_logs.LEVELS[level]
    shared_processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(
            colors=stream.isatty(), exception_formatter=_redacted_traceback
        )
    )
    structlog.configure(
        processors=[
            *shared_processors,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info if use_json else structlog.dev.set_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared_processors, structlog.stdlib.ExtraAdder()],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            redact_secrets,
            renderer,
        ],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    lean_logs.route_stdlib_logging(handler, numeric_level)
    lean_logs.use_structlog()  # the agent's loggers (shared/lean_logs.py) write through it


def configure_agent_logging(
    level: str = "info", log_format: LogFormat = "auto", stream: TextIO | None = None
) -> None:
    """The edge agent's logging: JSON lines without importing structlog
    (shared/lean_logs.py: about 1.1 MB an agent holds for months), the same lines
    `configure_logging` writes; a person's console through structlog, as there."""
    stream = stream or sys.stderr
    if writes_json(log_format, stream):
        lean_logs.configure_json_lines(level, stream)
    else:
        configure_logging(level, log_format, stream)


class RateLimitedLog:
    """Logs one line per key per interval and says how many were suppressed.

    Used where an outside party controls the rate (malformed MQTT payloads), so a
    flood of bad input cannot flood the log too.
    """

    def __init__(self, logger: EventLogger, interval_s: float) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._last_logged_at: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, event: str, /, **fields: object) -> bool:
        now = time.monotonic()
        last = self._last_logged_at.get(key)
        if last is not None and now - last < self._interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        self._last_logged_at[key] = now
        suppressed = self._suppressed.pop(key, 0)
        self._logger.warning(event, suppressed_since_last=suppressed, **fields)
        return True
