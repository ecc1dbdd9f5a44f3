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
