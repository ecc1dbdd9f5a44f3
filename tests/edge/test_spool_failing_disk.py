"""The outbox's disk spool (edge/agent/spool.py) on a disk that fails: read-only, full, or
out of inodes. Its promise: a record that cannot be written is lost (counted), the
agent goes on. The failures are injected where the spool meets the file system: the
`open` of a segment for appending, and the file object it writes to."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

import edge.agent.spool as spool_module
from edge.agent.spool import DiskSpool
from shared.topics import Channel
from tests.edge.test_spool import Clock, drain


def failing_appends(code: int) -> Callable[..., IO[Any]]:
    """`open` on a disk where no file can be opened for appending (made or grown)."""

    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> IO[Any]:
        if "a" in mode:
            raise OSError(code, "injected", str(file))
        return open(file, mode, *args, **kwargs)

    return open_


def spool(directory: Path, **bounds: int) -> DiskSpool:
    return DiskSpool(
        directory,
        max_bytes=bounds.get("max_bytes", 1 << 20),
        max_age_s=3600,
        clock=Clock(),
        segment_bytes=4096,
    )


def test_a_spool_on_a_read_only_disk_is_made_and_loses_records_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent restarted on a data directory remounted read-only: it starts, sends
    what it had spooled, and counts what it cannot keep."""
    first = spool(tmp_path)
    first.append(Channel.EVENTS, b"before the remount")
    first.close()
    monkeypatch.setattr(spool_module, "open", failing_appends(errno.EROFS), raising=False)
    again = spool(tmp_path)  # no exception: the agent can be made
    again.append(Channel.EVENTS, b"lost")
    again.append(Channel.LOGS, b"lost too")
    assert (again.dropped, again.write_errors) == (2, 3)  # the open at start, then each
    assert drain(again) == [b"before the remount"]
    monkeypatch.undo()  # the disk is writable again: the next append opens the segment
    again.append(Channel.EVENTS, b"after")
    assert drain(again) == [b"after"]
    again.close()


def test_a_segment_that_cannot_be_started_never_leaves_the_spool_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of inodes at a segment rollover: the records go on into the segment open,
    nothing raises, and once the disk has room again the spool rolls over as usual."""
    disk = spool(tmp_path)
    payloads = [f"record {number:03d} ".encode() * 20 for number in range(60)]  # ~14 KB
    for payload in payloads[:10]:  # about 2.4 KB: the first segment is not full yet
        disk.append(Channel.EVENTS, payload)
    monkeypatch.setattr(spool_module, "open", failing_appends(errno.ENOSPC), raising=False)
    for payload in payloads[10:30]:
        disk.append(Channel.EVENTS, payload)  # the rollover fails, the append does not
    assert disk.dropped == 0
    assert disk.write_errors > 0
    monkeypatch.undo()
    for payload in payloads[30:]:
        disk.append(Channel.EVENTS, payload)
    assert len(list(tmp_path.glob("*.seg"))) > 1  # rolled over once it could
    assert drain(disk) == payloads
    disk.close()


def test_while_no_segment_can_be_started_the_spool_keeps_to_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = spool(tmp_path, max_bytes=16 * 1024)
    disk.append(Channel.EVENTS, b"first")
    monkeypatch.setattr(spool_module, "open", failing_appends(errno.ENOSPC), raising=False)
    for number in range(200):  # about 50 KB offered
        disk.append(Channel.EVENTS, f"{number:03d}".encode() * 80)
    assert disk.pending_bytes <= 16 * 1024
    assert disk.dropped > 0
    taken = drain(disk)
    assert taken[0] == b"first"
    assert len(taken) - 1 + disk.dropped == 200


class ClosedFile:
    """A segment's file object closed under the spool (what a failed rollover left)."""

    def write(self, data: bytes) -> int:
        raise ValueError("write to closed file")

    def flush(self) -> None:
        raise ValueError("flush of closed file")

    def close(self) -> None:
        return None


def test_a_closed_segment_file_is_a_lost_record_not_an_error(tmp_path: Path) -> None:
    disk = spool(tmp_path)
    disk.append(Channel.EVENTS, b"before")
    disk._writer = ClosedFile()  # type: ignore[assignment]
    disk.append(Channel.EVENTS, b"lost")
    assert disk.dropped == 1
    disk.append(Channel.EVENTS, b"after")
    assert drain(disk) == [b"before", b"after"]


def test_a_spool_whose_directory_cannot_be_made_keeps_nothing_and_goes_on(
    tmp_path: Path,
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    disk = spool(blocked / "outbox")
    disk.append(Channel.EVENTS, b"lost")
    assert disk.dropped == 1
    assert disk.peek() is None
    disk.close()
