"""A worker's output on its way to the cloud: buffered, bounded, shipped in chunks.

Everything a worker prints goes to its log file on disk; a copy waits here until
the agent ships it on the `logs` channel (at most `SHIP_MAX_BYTES` per worker per
round). When the broker is unreachable or a worker prints faster than that, the
oldest unshipped output is dropped and the next chunk says how much.
"""

from __future__ import annotations

from collections.abc import Callable

BUFFER_MAX_BYTES = 256 * 1024
SHIP_MAX_BYTES = 64 * 1024


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
        self.on_output = on_output

    def append(self, data: bytes) -> None:
        self._pending += data
        overflow = len(self._pending) - self._max_bytes
        if overflow > 0:
            del self._pending[:overflow]
            self._offset += overflow
            self._dropped += overflow
        if self.on_output is not None:
            self.on_output()

    @property
    def pending_bytes(self) -> int:
        return len(self._pending)

    @property
    def shipped_offset(self) -> int:
        """Offset in the worker's output of the first byte not taken yet."""
        return self._offset

    def take(self, max_bytes: int = SHIP_MAX_BYTES) -> tuple[int, bytes, int] | None:
        """(offset, data, dropped bytes before it) of the next chunk, or None if nothing waits.

        Chunks end at a line break when one is near, so lines are not split across them.
        """
        if not self._pending:
            return None
        size = min(len(self._pending), max_bytes)
        if size < len(self._pending):
            newline = self._pending.rfind(b"\n", 0, size)
            if newline >= size // 2:
                size = newline + 1
        data = bytes(self._pending[:size])
        del self._pending[:size]
        offset, dropped = self._offset, self._dropped
        self._offset += size
        self._dropped = 0
        return offset, data, dropped
