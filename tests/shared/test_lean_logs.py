"""The agent's log lines without structlog (shared/lean_logs.py): the same lines structlog
writes, structlog never imported where they are JSON, and structlog's own path (capture,
console) kept everywhere else."""

from __future__ import annotations

import contextvars
import io
import json
import logging
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from shared import lean_logs
from shared.lean_logs import NOISY_LOGGERS, bind_contextvars, configure_json_lines, get_logger
from shared.logs import configure_agent_logging, configure_logging

ROOT = Path(__file__).resolve().parents[2]
TIMESTAMP = re.compile(r'"timestamp": "([^"]+)"')
ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # a library record's exc_info, as repr writes it


def comparable(line: str) -> str:
    return ADDRESS.sub(" at 0x", TIMESTAMP.sub("T", line))


@pytest.fixture(autouse=True)
def restore_logging(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Both configurations change process-wide state; put it back for the other tests
    (pytest's capture handlers of this phase are kept, as tests/shared/test_logs.py does)."""
    root = logging.getLogger()
    pytest_phase_handler = type(caplog.handler)
    session_handlers = [h for h in root.handlers if not isinstance(h, pytest_phase_handler)]
    level = root.level
    noisy_levels = {name: logging.getLogger(name).level for name in NOISY_LOGGERS}
    structlog_config = structlog.get_config()
    yield
    lean_logs.use_structlog()
    structlog.contextvars.clear_contextvars()
    structlog.configure(**structlog_config)
    phase_handlers: list[logging.Handler] = [
        h for h in root.handlers if isinstance(h, pytest_phase_handler)
    ]
    root.handlers[:] = session_handlers + phase_handlers
    root.setLevel(level)
    for name, noisy_level in noisy_levels.items():
        logging.getLogger(name).setLevel(noisy_level)


class Opaque:
    def __repr__(self) -> str:
        return "Opaque(7)"


class OwnRendering:
    def __structlog__(self) -> dict[str, int]:
        return {"rendered": 1}


def fail() -> None:
    raise ValueError("broker mqtt://agent:s3cret@broker.example:8883 refused")


def every_kind_of_line() -> None:
    """Each thing the agent logs: bound and call fields (some JSON cannot hold, some
    secret), context bound once, levels below the threshold, exceptions three ways, and
    stdlib records from the libraries with their extras."""
    log = get_logger("greenfed.agent").bind(node_id="n1", attempt=2)
    log.info("mqtt connected", url="mqtt://agent:hunter2@broker:1883", connects=1)
    log.debug("dropped below info")
    log.warning("probe slow", probe="nvidia", took_s=1.5, devices=("gpu0", "gpu1"))
    log.info("odd values", opaque=Opaque(), own=OwnRendering(), kinds={"gpu"}, none=None)
    log.info("secret field", password="hunter2", token="abc", nested={"api_key": "k"})
    # One key, as the agent binds (node_id): structlog orders several as its context's
    # hash table iterates, which no other implementation can follow.
    bind_contextvars(node_id="from-context")
    log.info("bound beats context", unicode="Zürich 東京")
    get_logger("greenfed.mqtt").error("no node id bound here", reason="x")
    try:
        fail()
    except ValueError as error:
        log.exception("upgrade failed", version="1.2.3")
        log.warning("kept going", exc_info=error)
        get_logger("greenfed.outbox").error("with the handled one", exc_info=True)
        logging.getLogger("paho.mqtt.client").error("socket error %s", "reset", exc_info=True)
    log.error("no exception being handled", exc_info=True)
    logging.getLogger("paho.mqtt.client").warning("%s pending", 3, extra={"queue": "out"})
    logging.getLogger("asyncio").info("chatty library line, dropped")
    log.critical("last line")


def lines_written(configure: Callable[[io.StringIO], None]) -> list[str]:
    stream = io.StringIO()
    configure(stream)
    # In a context of its own: what it binds leaves with it, as a task's would.
    contextvars.copy_context().run(every_kind_of_line)
    return stream.getvalue().splitlines()


def test_the_agents_json_lines_are_the_lines_structlog_writes() -> None:
    by_structlog = lines_written(lambda stream: configure_logging("info", "json", stream))
    lean = lines_written(lambda stream: configure_json_lines("info", stream))

    assert len(by_structlog) == 13
    assert len(lean) == len(by_structlog)
    for structlog_line, lean_line in zip(by_structlog, lean, strict=True):
        for line in (structlog_line, lean_line):
            stamp = datetime.fromisoformat(json.loads(line)["timestamp"].replace("Z", "+00:00"))
            assert stamp.utcoffset() == timedelta(0)
        # Byte for byte (keys, their order, escaping, tracebacks), but for the time and
        # where an object's repr gives its address.
        assert comparable(lean_line) == comparable(structlog_line)
    parsed = [json.loads(line) for line in lean]
    assert parsed[0]["url"] == "mqtt://agent:***@broker:1883"
    assert parsed[2]["opaque"] == "Opaque(7)"
    assert parsed[2]["own"] == {"rendered": 1}
    assert parsed[3]["password"] == "***"
    assert parsed[4]["node_id"] == "n1"
    assert parsed[5]["node_id"] == "from-context"
    assert "Traceback (most recent call last)" in parsed[6]["exception"]
    assert "s3cret" not in lean[6]
    pending = parsed[11]
    assert (pending["event"], pending["queue"], pending["level"]) == ("3 pending", "out", "warning")


def test_the_level_drops_the_agents_lines_and_the_libraries() -> None:
    stream = io.StringIO()
    configure_json_lines("warning", stream)

    get_logger("greenfed.agent").info("chatty")
    logging.getLogger("some.library").info("chatty too")
    get_logger("greenfed.agent").warning("kept")

    assert [json.loads(line)["event"] for line in stream.getvalue().splitlines()] == ["kept"]


def test_without_json_lines_configured_structlog_writes_them_and_capture_sees_them() -> None:
    lean_logs.use_structlog()
    with capture_logs() as captured:
        get_logger("greenfed.agent").bind(node_id="n1").warning("probe slow", probe="npu")

    assert captured == [
        {"node_id": "n1", "probe": "npu", "event": "probe slow", "log_level": "warning"}
    ]


def test_the_agent_at_a_terminal_gets_structlogs_console() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    configure_agent_logging("info", "auto", stream)
    get_logger("greenfed.agent").info("hello there", node_id="n1")

    text = stream.getvalue()
    assert "hello there" in text
    assert "node_id" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])


def test_an_agent_writing_json_lines_never_imports_structlog() -> None:
    """As `python -m greenfed edge run` starts the agent (greenfed/__main__.py, then
    greenfed/edge_run.py): its first line, an error's traceback and a library's record
    are written, and structlog is still not imported."""
    script = (
        "import io, json, logging, sys\n"
        "from edge.deferred_imports import defer_imports\n"
        "defer_imports()\n"
        "import greenfed.edge_run, edge.main\n"
        "from shared.logs import configure_agent_logging\n"
        "from shared.lean_logs import bind_contextvars, get_logger\n"
        "stream = io.StringIO()\n"
        "configure_agent_logging('info', 'auto', stream)\n"
        "bind_contextvars(node_id='n1')\n"
        "get_logger('greenfed.agent').info('agent started', version='1')\n"
        "try:\n"
        "    1 / 0\n"
        "except ZeroDivisionError:\n"
        "    get_logger('greenfed.agent').exception('failed')\n"
        "logging.getLogger('paho').warning('socket closed')\n"
        "lines = [json.loads(line) for line in stream.getvalue().splitlines()]\n"
        "assert [line['event'] for line in lines] == ['agent started', 'failed', 'socket closed']\n"
        "assert {line['node_id'] for line in lines} == {'n1'}\n"
        "assert 'ZeroDivisionError' in lines[1]['exception']\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'structlog'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"
