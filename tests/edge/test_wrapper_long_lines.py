"""The wrapper's labelled copy of a gang member's output: a line that never ends is
written in labelled pieces, each cut between UTF-8 characters, and nothing is lost."""

from __future__ import annotations

import os
import threading
from typing import IO, cast

from edge.training.wrapper import READ_CHUNK_BYTES, _copy, _Log


class _Collected:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)


def test_a_line_that_never_ends_is_cut_between_characters() -> None:
    label = b"[1] "
    # A 3-byte character straddles the first READ_CHUNK_BYTES boundary.
    text = ("a" * (READ_CHUNK_BYTES - 1) + "█" * 40_000 + "\ntail").encode()
    reader_fd, writer_fd = os.pipe()
    collected = _Collected()
    with os.fdopen(reader_fd, "rb", buffering=0) as reader:

        def feed() -> None:
            os.write(writer_fd, text)
            os.close(writer_fd)

        feeder = threading.Thread(target=feed)
        feeder.start()
        _copy(cast(IO[bytes], reader), cast(_Log, collected), label, [])
        feeder.join(timeout=10)
    assert len(collected.writes) >= 3  # the long line in pieces, then the tail
    pieces = b"".join(collected.writes).split(b"\n")[:-1]
    for piece in pieces:
        assert piece.startswith(label)
        piece[len(label) :].decode("utf-8")  # strict: no character cut in two
    assert b"".join(piece[len(label) :] for piece in pieces) == text.replace(b"\n", b"")
