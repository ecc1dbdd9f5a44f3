"""The outbox's spool (edge/agent/spool.py): in order, across restarts and half-written
records, within its bounds in bytes and age, on disk and in memory alike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge.agent.spool import DiskSpool, MemorySpool, Record, Spool
from shared.topics import Channel

SpoolFactory = Callable[..., Spool]


class Clock:
    """The node's wall clock (called) and its monotonic clock (`monotonic`): `advance`
    moves both, as time passing does; setting `now` steps the wall clock alone."""

    def __init__(self) -> None:
        self.now = 1_000.0
        self.monotonic_now = 50.0

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.monotonic_now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.monotonic_now += seconds


def drain(spool: Spool) -> list[bytes]:
    taken = []
    while (record := spool.peek()) is not None:
        taken.append(record.payload)
        spool.take(record)
    return taken


@pytest.fixture(params=["disk", "memory"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> SpoolFactory:
    def build(*, max_bytes: int = 1 << 20, max_age_s: float = 3600.0, clock: Clock) -> Spool:
        if request.param == "memory":
            return MemorySpool(
                max_bytes=max_bytes, max_age_s=max_age_s, clock=clock, monotonic=clock.monotonic
            )
        return DiskSpool(
            tmp_path / "outbox",
            max_bytes=max_bytes,
            max_age_s=max_age_s,
            clock=clock,
            monotonic=clock.monotonic,
            segment_bytes=4096,
        )

    return build


def test_records_come_out_in_order_with_their_channel(make: SpoolFactory) -> None:
    spool = make(clock=Clock())
    for number in range(300):  # several segments on disk
        channel = Channel.EVENTS if number % 3 else Channel.LOGS
        spool.append(channel, f"record {number}".encode())
    first = spool.peek()
    assert first == Record(Channel.LOGS, b"record 0", 1_000.0)
    assert spool.peek() is first  # not taken yet: the same record again
    assert drain(spool) == [f"record {n}".encode() for n in range(300)]
    assert spool.pending_bytes == 0
    assert (spool.dropped, spool.expired) == (0, 0)


def test_past_its_bytes_the_oldest_are_dropped_and_counted(make: SpoolFactory) -> None:
    spool = make(max_bytes=64 * 1024, clock=Clock())
    payload = b"x" * 200
    for number in range(2_000):  # about 430 KB
        spool.append(Channel.EVENTS, payload + str(number).encode())
    assert spool.pending_bytes <= 64 * 1024
    assert spool.dropped > 0
    taken = drain(spool)
    assert len(taken) + spool.dropped == 2_000
    assert taken[-1].endswith(b"1999")  # the newest are kept, in order
    numbers = [int(item[200:]) for item in taken]
    assert numbers == list(range(2_000 - len(taken), 2_000))


def test_records_too_old_when_their_turn_comes_are_dropped_unsent(make: SpoolFactory) -> None:
    clock = Clock()
    spool = make(max_age_s=60.0, clock=clock)
    spool.append(Channel.EVENTS, b"old")
    clock.advance(50)
    spool.append(Channel.EVENTS, b"recent")
    clock.advance(20)  # "old" is 70 s old, "recent" 20 s
    assert drain(spool) == [b"recent"]
    assert spool.expired == 1


DAY_S = 86_400.0


def test_a_clock_stepped_forward_does_not_expire_what_was_just_spooled(
    make: SpoolFactory,
) -> None:
    """A board that booted with its clock days behind (no RTC), then NTP: what the
    agent spooled a moment before the step is not days old."""
    clock = Clock()
    spool = make(max_age_s=60.0, clock=clock)
    spool.append(Channel.EVENTS, b"before the step")
    clock.now += 10 * DAY_S
    spool.append(Channel.EVENTS, b"after the step")
    clock.advance(30)
    assert drain(spool) == [b"before the step", b"after the step"]
    assert spool.expired == 0


def test_a_clock_stepped_back_does_not_keep_what_is_too_old(make: SpoolFactory) -> None:
    clock = Clock()
    spool = make(max_age_s=60.0, clock=clock)
    spool.append(Channel.EVENTS, b"old")
    clock.advance(70)
    clock.now -= DAY_S  # by the wall clock alone, "old" would be spooled tomorrow
    spool.append(Channel.EVENTS, b"recent")
    assert drain(spool) == [b"recent"]
    assert spool.expired == 1


def test_what_an_earlier_agent_spooled_is_aged_by_the_wall_clock(tmp_path: Path) -> None:
    """The monotonic clock of another process (or another boot) says nothing."""
    clock = Clock()

    def open_spool() -> DiskSpool:
        return DiskSpool(
            tmp_path, max_bytes=1 << 20, max_age_s=60.0, clock=clock, monotonic=clock.monotonic
        )

    spool = open_spool()
    spool.append(Channel.EVENTS, b"old")
    clock.advance(50)
    spool.append(Channel.EVENTS, b"recent")
    spool.close()
    clock.now += 20  # "old" is 70 s old by the wall clock; the next agent's clock starts
    clock.monotonic_now = 0.0
    again = open_spool()
    again.append(Channel.EVENTS, b"new")
    assert drain(again) == [b"recent", b"new"]
    assert again.expired == 1
    again.close()


@pytest.mark.parametrize("kind", ["disk", "memory"])
def test_without_a_monotonic_clock_given_the_process_one_is_used(tmp_path: Path, kind: str) -> None:
    """As the agent builds its spools: the wall clock it is given, stepped here, and the
    process's own monotonic clock, which no step moves."""
    clock = Clock()
    spool: Spool
    if kind == "disk":
        spool = DiskSpool(tmp_path, max_bytes=1 << 20, max_age_s=60.0, clock=clock)
    else:
        spool = MemorySpool(max_bytes=1 << 20, max_age_s=60.0, clock=clock)
    spool.append(Channel.EVENTS, b"just now")
    clock.now += 10 * DAY_S
    assert drain(spool) == [b"just now"]
    assert spool.expired == 0
    spool.close()


def test_a_record_dropped_while_it_was_being_sent_is_not_taken_twice(
    make: SpoolFactory,
) -> None:
    spool = make(max_bytes=64 * 1024, clock=Clock())
    spool.append(Channel.EVENTS, b"first")
    sending = spool.peek()
    assert sending is not None
    for _ in range(2_000):  # meanwhile the spool overflows and drops "first"
        spool.append(Channel.EVENTS, b"y" * 200)
    spool.take(sending)  # acknowledged late: nothing else moves
    remaining = drain(spool)
    assert len(remaining) + spool.dropped == 2_001
    assert b"first" not in remaining


def test_a_reopened_disk_spool_resumes_after_what_was_taken(tmp_path: Path) -> None:
    clock = Clock()

    def open_spool() -> DiskSpool:
        return DiskSpool(
            tmp_path, max_bytes=1 << 20, max_age_s=3600, clock=clock, segment_bytes=4096
        )

    spool = open_spool()
    for number in range(200):
        spool.append(Channel.EVENTS, f"event {number}".encode())
    for _ in range(70):
        record = spool.peek()
        assert record is not None
        spool.take(record)
    spool.close()
    again = open_spool()
    again.append(Channel.LOGS, b"after the restart")
    assert drain(again) == [f"event {n}".encode() for n in range(70, 200)] + [b"after the restart"]
    again.close()
    assert len(list(tmp_path.glob("*.seg"))) == 1  # fully read segments are deleted


def test_a_half_written_record_is_cut_off_when_the_spool_opens(tmp_path: Path) -> None:
    clock = Clock()
    spool = DiskSpool(tmp_path, max_bytes=1 << 20, max_age_s=3600, clock=clock)
    spool.append(Channel.EVENTS, b"whole")
    spool.close()
    (segment,) = tmp_path.glob("*.seg")
    with open(segment, "ab") as file:  # the agent died in the middle of an append
        file.write(b"\x40\x00\x00\x00\x01")
    again = DiskSpool(tmp_path, max_bytes=1 << 20, max_age_s=3600, clock=clock)
    again.append(Channel.EVENTS, b"next")
    assert drain(again) == [b"whole", b"next"]


@settings(max_examples=40, deadline=None)
@given(
    operations=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.binary(min_size=0, max_size=300)),
            st.tuples(st.just("take"), st.integers(1, 5)),
            st.tuples(st.just("reopen"), st.none()),
        ),
        max_size=80,
    )
)
def test_whatever_happens_every_record_is_taken_once_in_order(
    tmp_path_factory: pytest.TempPathFactory, operations: list[tuple[str, object]]
) -> None:
    directory = tmp_path_factory.mktemp("spool")
    clock = Clock()

    def open_spool() -> DiskSpool:
        return DiskSpool(
            directory, max_bytes=1 << 20, max_age_s=3600, clock=clock, segment_bytes=512
        )

    spool = open_spool()
    appended: list[bytes] = []
    taken: list[bytes] = []
    for operation, argument in operations:
        if operation == "append":
            assert isinstance(argument, bytes)
            spool.append(Channel.LOGS, argument)
            appended.append(argument)
        elif operation == "take":
            assert isinstance(argument, int)
            for _ in range(argument):
                record = spool.peek()
                if record is None:
                    break
                taken.append(record.payload)
                spool.take(record)
        else:
            spool.close()
            spool = open_spool()
    taken += drain(spool)
    spool.close()
    assert taken == appended


def test_a_cursor_past_what_is_on_disk_resumes_at_the_last_whole_record(
    tmp_path: Path,
) -> None:
    clock = Clock()
    spool = DiskSpool(tmp_path, max_bytes=1 << 20, max_age_s=3600, clock=clock)
    for number in range(10):
        spool.append(Channel.EVENTS, f"event {number}".encode())
    spool.close()
    # A power cut kept the renamed cursor but not the segment's unsynced tail.
    (segment,) = tmp_path.glob("*.seg")
    (tmp_path / "cursor").write_text(f"0 {segment.stat().st_size + 100}\n")
    with open(segment, "r+b") as file:
        file.truncate(segment.stat().st_size - 7)  # half of the last record
    again = DiskSpool(tmp_path, max_bytes=1 << 20, max_age_s=3600, clock=clock)
    again.append(Channel.EVENTS, b"after")
    assert drain(again) == [b"after"]  # nothing read from the middle of a record
    # A cursor off a record boundary goes back to the one before it.
    again.close()
    (tmp_path / "cursor").write_text("0 3\n")
    third = DiskSpool(tmp_path, max_bytes=1 << 20, max_age_s=3600, clock=clock)
    assert drain(third)[:2] == [b"event 0", b"event 1"]


def test_a_damaged_segment_is_skipped_and_counted_not_fatal(tmp_path: Path) -> None:
    clock = Clock()
    spool = DiskSpool(tmp_path, max_bytes=1 << 20, max_age_s=3600, clock=clock)
    spool.append(Channel.EVENTS, b"first")
    spool.close()
    (segment,) = tmp_path.glob("*.seg")
    data = bytearray(segment.read_bytes())
    data[4] = 99  # its channel code is no channel
    segment.write_bytes(bytes(data))
    again = DiskSpool(tmp_path, max_bytes=1 << 20, max_age_s=3600, clock=clock)
    again.append(Channel.EVENTS, b"second")
    assert drain(again) == [b"second"]
    assert again.dropped == 1


class FullDisk:
    """A segment file object on a disk that has filled up (the seam: the file system)."""

    def write(self, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    def flush(self) -> None:
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        return None


def test_a_write_that_fails_loses_that_record_only(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path, max_bytes=1 << 20, max_age_s=3600, clock=Clock())
    spool.append(Channel.EVENTS, b"before")
    spool._writer = FullDisk()  # type: ignore[assignment]
    spool.append(Channel.EVENTS, b"lost")  # counted, not raised
    assert (spool.dropped, spool.write_errors) == (1, 1)
    spool.append(Channel.EVENTS, b"after")  # the disk has room again
    assert drain(spool) == [b"before", b"after"]
