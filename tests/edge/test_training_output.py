"""Worker output waiting to be shipped: bounded, chunked at line ends, honest about drops."""

from __future__ import annotations

from edge.training.output import OutputBuffer


def test_output_is_shipped_in_order_with_offsets() -> None:
    buffer = OutputBuffer()
    buffer.append(b"epoch 1\n")
    buffer.append(b"epoch 2\n")
    assert buffer.take() == (0, b"epoch 1\nepoch 2\n", 0)
    assert buffer.take() is None
    buffer.append(b"epoch 3\n")
    assert buffer.take() == (16, b"epoch 3\n", 0)


def test_chunks_end_at_a_line_break_when_one_is_near() -> None:
    buffer = OutputBuffer()
    buffer.append(b"a" * 90 + b"\n" + b"b" * 50 + b"\n")
    assert buffer.take(max_bytes=100) == (0, b"a" * 90 + b"\n", 0)
    assert buffer.take(max_bytes=100) == (91, b"b" * 50 + b"\n", 0)


def test_overflow_drops_the_oldest_output_and_says_how_much() -> None:
    buffer = OutputBuffer(max_bytes=100)
    buffer.append(b"x" * 150)
    offset, data, dropped = buffer.take() or (0, b"", 0)
    assert (offset, len(data), dropped) == (50, 100, 50)
    buffer.append(b"next\n")
    assert buffer.take() == (150, b"next\n", 0)


def test_every_append_signals_that_output_waits() -> None:
    signals: list[int] = []
    buffer = OutputBuffer(on_output=lambda: signals.append(1))
    buffer.append(b"x")
    buffer.append(b"y")
    assert len(signals) == 2


# A progress bar as tqdm draws it: three-byte characters and carriage returns, no "\n".
PROGRESS = ("\r" + "█" * 50 + " 100%").encode() * 40


def shipped(buffer: OutputBuffer, max_bytes: int) -> list[tuple[int, bytes, int]]:
    chunks = []
    while (chunk := buffer.take(max_bytes=max_bytes)) is not None:
        chunks.append(chunk)
    return chunks


def test_chunks_are_never_cut_inside_a_character() -> None:
    buffer = OutputBuffer()
    buffer.append(PROGRESS)
    chunks = shipped(buffer, max_bytes=1000)
    assert len(chunks) > 1
    for _, data, _ in chunks:
        data.decode("utf-8")  # strict: each chunk is whole characters
    assert [offset for offset, _, _ in chunks] == [
        sum(len(data) for _, data, _ in chunks[:index]) for index in range(len(chunks))
    ]
    assert b"".join(data for _, data, _ in chunks) == PROGRESS


def test_a_character_not_read_whole_yet_waits_for_its_rest() -> None:
    bar = "█".encode()
    buffer = OutputBuffer()
    buffer.append(b"10% " + bar[:2])  # a poll read the log as the worker was writing it
    assert buffer.take() == (0, b"10% ", 0)
    assert buffer.take() is None
    assert buffer.pending_bytes == 2  # not shipped: a restarted agent reads it again
    buffer.append(bar[2:] + b" 20%")
    assert buffer.take() == (4, bar + b" 20%", 0)


def test_when_the_output_ends_a_truncated_character_is_shipped_as_it_is() -> None:
    signals: list[int] = []
    buffer = OutputBuffer(on_output=lambda: signals.append(1))
    buffer.append(b"done " + "█".encode()[:2])
    assert buffer.take() == (0, b"done ", 0)
    buffer.end()
    assert len(signals) == 2  # the shipper is woken for what was held back
    assert buffer.take() == (5, "█".encode()[:2], 0)
    assert buffer.take() is None


def test_bytes_that_are_not_utf8_are_cut_where_the_size_says() -> None:
    buffer = OutputBuffer()
    buffer.append(b"\xff" * 10 + b"\x80" * 10)
    assert [data for _, data, _ in shipped(buffer, max_bytes=8)] == [
        b"\xff" * 8,
        b"\xff\xff" + b"\x80" * 6,
        b"\x80" * 4,
    ]


def test_dropping_the_oldest_output_drops_whole_characters() -> None:
    buffer = OutputBuffer(max_bytes=100)
    buffer.append("█".encode() * 40)  # 120 bytes: 20 over, in the middle of a character
    offset, data, dropped = buffer.take() or (0, b"", 0)
    assert (offset, dropped) == (21, 21)
    assert data.decode("utf-8") == "█" * 33
