"""A worker's output on its way to the cloud: buffered, bounded, shipped in chunks.

Everything a worker prints goes to its log file on disk; a copy waits here until
the agent ships it on the `logs` channel (at most `SHIP_MAX_BYTES` per worker per
round). When the broker is unreachable or a worker prints faster than that, the
oldest unshipped output is dropped and the next chunk says how much.

Each chunk is decoded alone (edge/agent/job_logs.py), so none is cut inside a UTF-8
character: a cut that would be is moved back to the character's start, and a character
not read whole yet waits for its rest (until the worker's output ends). Bytes that are
not UTF-8 are cut wherever the size says, as before: the agent replaces them anyway.
"""

from __future__ import annotations

from collections.abc import Callable

BUFFER_MAX_BYTES = 256 * 1024
SHIP_MAX_BYTES = 64 * 1024
# The longest UTF-8 character, in bytes.
UTF8_MAX_BYTES = 4


class OutputBuffer:
    def __init__(
        self,
        on_output: Callable[[], None] | None = None,
        max_bytes: int = BUFFER_MAX_BYTES,
        offset: int = 0,
    ) -> None:
        """`offset`: where in the worker's output the next byte appended is (a worker
        taken over from an earlier agent has shipped that much already)."""
        self._pending = bytearray()
        self._max_bytes = max_bytes
        self._offset = offset  # worker-output offset of the first pending byte
        self._dropped = 0
        self._ended = False  # the worker's output is over: nothing is held back
        self.on_output = on_output

    def append(self, data: bytes) -> None:
        self._pending += data
        overflow = len(self._pending) - self._max_bytes
        if overflow > 0:
            # The rest of a character whose start is dropped goes with it.
            overflow += _continuation_bytes_at(self._pending, overflow)
            del self._pending[:overflow]
            self._offset += overflow
            self._dropped += overflow
        if self.on_output is not None:
            self.on_output()

    def end(self) -> None:
        """The worker has ended: what waited for the rest of a character is shipped as
        it is (the agent replaces what does not decode)."""
        self._ended = True
        if self._pending and self.on_output is not None:
            self.on_output()

    @property
    def pending_bytes(self) -> int:
        return len(self._pending)

    @property
    def shipped_offset(self) -> int:
        """Offset in the worker's output of the first byte not taken yet."""
        return self._offset

    def peek(self, max_bytes: int = SHIP_MAX_BYTES) -> tuple[int, bytes, int] | None:
        """What `take(max_bytes)` would return now, left waiting: the agent sees whether
        the chunk fits in a message before it takes it."""
        if not self._pending:
            return None
        size = min(len(self._pending), max_bytes)
        if size < len(self._pending):
            newline = self._pending.rfind(b"\n", 0, size)
            if newline >= size // 2:
                size = newline + 1
            else:
                # A chunk of less than one character (max_bytes < 4) is cut inside it.
                size = character_start(self._pending, size) or size
        elif not self._ended:
            size = character_start(self._pending, size)
            if size == 0:
                return None
        return self._offset, bytes(self._pending[:size]), self._dropped

    def take(self, max_bytes: int = SHIP_MAX_BYTES) -> tuple[int, bytes, int] | None:
        """(offset, data, dropped bytes before it) of the next chunk, or None if nothing
        waits (or only the start of a character whose rest is not read yet).

        Chunks end at a line break when one is near, so lines are not split across them,
        and never inside a UTF-8 character.
        """
        chunk = self.peek(max_bytes)
        if chunk is not None:
            self.consume(len(chunk[1]))
        return chunk

    def consume(self, size: int) -> None:
        """Let the first `size` waiting bytes go: a chunk `peek` returned, now shipped."""
        del self._pending[:size]
        self._offset += size
        self._dropped = 0


def _is_continuation(byte: int) -> bool:
    """A byte inside a UTF-8 character (10xxxxxx), never its first."""
    return byte & 0xC0 == 0x80


def _character_length(lead: int) -> int:
    """The length of the UTF-8 character `lead` starts (1 for a byte that starts none)."""
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 1


def character_start(data: bytes | bytearray, cut: int) -> int:
    """`cut`, or the start of the UTF-8 character it would cut in two (at the end of
    `data`: one not whole yet). Bytes that are not UTF-8 keep the cut where it is."""
    if cut < len(data) and not _is_continuation(data[cut]):
        return cut
    for back in range(1, UTF8_MAX_BYTES):
        start = cut - back
        if start < 0:
            break
        if not _is_continuation(data[start]):
            return start if _character_length(data[start]) > back else cut
    return cut


def _continuation_bytes_at(data: bytearray, start: int) -> int:
    """How many bytes from `start` continue a character begun before it (at most 3)."""
    count = 0
    while (
        count < UTF8_MAX_BYTES - 1
        and start + count < len(data)
        and _is_continuation(data[start + count])
    ):
        count += 1
    return count
