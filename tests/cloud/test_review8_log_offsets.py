"""Job output that is not valid UTF-8 (cloud/streams/logs.py): the agent ships a chunk's
raw byte offset with its text decoded, each undecodable byte replaced by U+FFFD (3 bytes
in UTF-8), so the text's length is not the output's. No later output may be taken for
a copy and dropped for it, copies must still be dropped, and lost output still marked."""

from __future__ import annotations

from cloud.streams.logs import JobLogStore, render_tail
from edge.training.output import OutputBuffer
from shared.messages import JobLogChunk

# One line of Latin-1: each accented letter is one byte that does not decode.
LATIN1_LINE = "Température réglée à 21°C; état: prêt; données reçues: àéîõü çÇ ñÑ\n"
LATIN1_OUTPUT = LATIN1_LINE.encode("latin-1") * 8
EPOCH_LINES = [f"epoch {n} loss 0.{90 - n * 10}\n".encode() for n in range(1, 5)]


def shipped(output: OutputBuffer, data: bytes) -> JobLogChunk:
    """The next chunk of a worker's output, made as the agent makes it."""
    output.append(data)
    taken = output.take()
    assert taken is not None
    offset, raw, dropped = taken
    return JobLogChunk(
        node_id="gpu-a",
        job_id="job-1",
        attempt=0,
        offset=offset,
        text=raw.decode("utf-8", errors="replace"),
        dropped_bytes=dropped,
        sent_at=1.0,
    )


def rendered(store: JobLogStore) -> str:
    text, _ = render_tail(store.snapshot("job-1"), prefix=False, tail_lines=None)
    return text


def latin1_as_shipped() -> str:
    return LATIN1_OUTPUT.decode("utf-8", errors="replace")


def test_output_after_undecodable_bytes_is_all_kept() -> None:
    store, output = JobLogStore(), OutputBuffer()
    for data in [LATIN1_OUTPUT, *EPOCH_LINES]:
        store.append(shipped(output, data))
    assert rendered(store) == latin1_as_shipped() + b"".join(EPOCH_LINES).decode()


def test_copies_after_undecodable_bytes_are_not_kept_twice() -> None:
    store, output = JobLogStore(), OutputBuffer()
    latin1 = shipped(output, LATIN1_OUTPUT)
    first, second = (shipped(output, line) for line in EPOCH_LINES[:2])
    # QoS 1 delivers some again, soon after or later.
    for chunk in [latin1, latin1, first, latin1, first, second, first, second, latin1]:
        store.append(chunk)
    assert rendered(store) == latin1_as_shipped() + first.text + second.text
    assert len(store.snapshot("job-1").pieces) == 3


def test_output_lost_after_undecodable_bytes_is_still_marked() -> None:
    store, output = JobLogStore(), OutputBuffer()
    store.append(shipped(output, LATIN1_OUTPUT))
    store.append(shipped(output, EPOCH_LINES[0]))
    shipped(output, EPOCH_LINES[1])  # never arrives
    store.append(shipped(output, EPOCH_LINES[2]))
    assert rendered(store) == (
        latin1_as_shipped()
        + EPOCH_LINES[0].decode()
        + f"[greenfed: {len(EPOCH_LINES[1])} bytes of output missing here]\n"
        + EPOCH_LINES[2].decode()
    )


def test_much_output_lost_right_after_undecodable_bytes_is_marked_never_overstated() -> None:
    store, output = JobLogStore(), OutputBuffer()
    store.append(shipped(output, LATIN1_OUTPUT))
    lost_bytes = 4 * len(LATIN1_OUTPUT)
    shipped(output, b"x" * (lost_bytes - 1) + b"\n")  # never arrives
    last = shipped(output, EPOCH_LINES[0])
    store.append(last)
    pieces = store.snapshot("job-1").pieces
    assert [piece.text for piece in pieces] == [latin1_as_shipped(), last.text]
    # How many raw bytes each U+FFFD stood for is unknown: the count may fall short.
    assert 0 < pieces[-1].missing_bytes <= lost_bytes


def test_a_worker_that_prints_replacement_characters_itself_has_no_gap_marked() -> None:
    store, output = JobLogStore(), OutputBuffer()
    for data in ["decoded with errors: \ufffd\ufffd\ufffd\n".encode(), *EPOCH_LINES]:
        store.append(shipped(output, data))
    assert (
        rendered(store)
        == "decoded with errors: \ufffd\ufffd\ufffd\n" + b"".join(EPOCH_LINES).decode()
    )
    assert all(piece.missing_bytes == 0 for piece in store.snapshot("job-1").pieces)
