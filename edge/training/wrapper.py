"""The process a training worker runs under, so that it outlives the agent:

    python .../edge/training/wrapper.py --log PATH --max-log-bytes N --exit-file PATH -- CMD...

The agent starts it in a session (process group) of its own, with no pipe to itself:
the wrapper runs the command in that group, writes its output (stdout and stderr
together) to the bounded log, and when the command ends writes its exit status,
atomically, to the exit file, where an agent started later collects it. SIGTERM and
SIGINT are left to the command (the agent signals the whole group); the wrapper only
waits for it, so that the status is always written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from edge.training.logs import BoundedLog

READ_CHUNK_BYTES = 64 * 1024
# After the command exits, what it printed last is read for at most this long.
OUTPUT_GRACE_S = 2.0


def write_exit_status(path: Path, returncode: int | None, error: str = "") -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    status = {"returncode": returncode, "error": error, "finished_at": time.time()}
    temporary.write_text(json.dumps(status), encoding="utf-8")
    os.replace(temporary, path)


def read_exit_status(path: Path) -> tuple[int | None, str] | None:
    """(returncode, error) the wrapper recorded; None if it recorded nothing."""
    try:
        status = json.loads(path.read_text(encoding="utf-8"))
        return status["returncode"], str(status.get("error", ""))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def _ignore(signum: int, frame: object) -> None:
    """Installed (not SIG_IGN, which the command would inherit) for SIGTERM and SIGINT."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edge/training/wrapper.py")
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--max-log-bytes", type=int, required=True)
    parser.add_argument("--exit-file", type=Path, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    signal.signal(signal.SIGTERM, _ignore)
    signal.signal(signal.SIGINT, _ignore)
    with BoundedLog(args.log, args.max_log_bytes) as log:
        try:
            child = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        except (OSError, IndexError) as error:
            reason = f"cannot start: {error}"
            log.write(f"greenfed: {reason}\n".encode())
            log.flush()
            write_exit_status(args.exit_file, None, reason)
            return 0
        assert child.stdout is not None
        reader = threading.Thread(target=_copy, args=(child.stdout.fileno(), log), daemon=True)
        reader.start()
        # The command's exit is the end, not the pipe's: something it left running in the
        # background (`cmd &`, a metrics daemon) may hold the pipe open for ever.
        returncode = child.wait()
        reader.join(timeout=OUTPUT_GRACE_S)
    write_exit_status(args.exit_file, returncode)
    return 0


def _copy(output: int, log: BoundedLog) -> None:
    while chunk := os.read(output, READ_CHUNK_BYTES):  # whatever is there, at once
        # A full disk loses output, never the job: the pipe is always drained.
        with contextlib.suppress(OSError):
            log.write(chunk)
            log.flush()


if __name__ == "__main__":
    sys.exit(main())
