"""Where the agent keeps its state on disk, under `<data_dir>/state`: the last applied
`desired` document exactly as it arrived (signed, so it is verified again when it is
read back) and the last reported state. Each file is replaced atomically (written
beside, flushed to disk, renamed), so a crash leaves the old file or the new one,
never half of either. The outbox's spool lives beside them (edge/agent/spool.py), and
so do the GPUs held to a power limit (edge/training/power_limits.py).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from edge.atomic_files import write_atomically
from shared.key_files import make_private_dir
from shared.lean_logs import get_logger

_log = get_logger("greenfed.agent.state")
DESIRED_FILE = "desired.json"
REPORTED_FILE = "reported.json"
OUTBOX_DIR = "outbox"
POWER_LIMITS_FILE = "power_limits.json"


class AgentStateFiles:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # Private: a worker must not read what the agent keeps (`greenfed edge doctor`).
        make_private_dir(directory)
        # Saves run in threads: the newest payload of each file is written, whichever
        # thread gets there last, one write at a time.
        self._newest: dict[str, bytes] = {}
        # Whether the last write of each file succeeded: what a save whose payload a
        # later thread wrote for it is told.
        self._last_write_ok: dict[str, bool] = {}
        self._lock = threading.Lock()
        self.write_errors = 0
        self.read_errors = 0

    @property
    def outbox_dir(self) -> Path:
        return self.directory / OUTBOX_DIR

    @property
    def power_limits_path(self) -> Path:
        return self.directory / POWER_LIMITS_FILE

    async def save_desired(self, payload: bytes) -> bool:
        """Whether the file now holds `payload` (or a newer one saved meanwhile): a
        document whose save failed must be saved again when it comes again."""
        return await self._save(DESIRED_FILE, payload)

    def load_desired(self) -> bytes | None:
        return self._read(DESIRED_FILE)

    async def save_reported(self, payload: bytes) -> bool:
        return await self._save(REPORTED_FILE, payload)

    def load_reported(self) -> bytes | None:
        return self._read(REPORTED_FILE)

    async def _save(self, name: str, payload: bytes) -> bool:
        self._newest[name] = payload
        return await asyncio.to_thread(self._write_newest, name)

    def _write_newest(self, name: str) -> bool:
        """Whether the newest payload of `name` is on disk."""
        with self._lock:
            payload = self._newest.pop(name, None)
            if payload is None:
                # Another thread already wrote it, the newest then, under this lock.
                return self._last_write_ok.get(name, False)
            try:
                write_atomically(self.directory / name, payload)
            except OSError as error:
                # A full or read-only disk must not stop a node that serves from memory:
                # the old file stays (whole), and the next save tries again.
                self.write_errors += 1
                _log.warning("agent state not saved", file=name, error=str(error))
                self._last_write_ok[name] = False
                return False
            self._last_write_ok[name] = True
            return True

    def _read(self, name: str) -> bytes | None:
        """The file's bytes; None when there is none, or when it cannot be read."""
        try:
            return (self.directory / name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            # A failing disk (EIO), a permission or a directory where the file should be
            # must not stop the agent at every start: it goes on as if nothing was kept,
            # and the broker's retained documents reconcile it.
            self.read_errors += 1
            _log.warning("agent state not read", file=name, error=str(error))
            return None
