"""Time-ordered identifiers: ULIDs (48-bit milliseconds + 80 random bits, Crockford base32).

Sorting ids sorts by creation time, which is what makes keyset pagination over ids
stable under inserts: new work always sorts after every id a client has already seen
(up to clock skew between replicas, see docs/store.md). Within one generator, ids of
the same millisecond increase by one, so one process never emits them out of order.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from typing import Final

_ALPHABET: Final = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
ID_LENGTH: Final = 26
_RANDOM_BITS: Final = 80
_RANDOM_MAX: Final = (1 << _RANDOM_BITS) - 1
ID_PATTERN: Final = re.compile(r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$")


def _encode(value: int) -> str:
    chars = []
    for _ in range(ID_LENGTH):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def is_valid_id(text: str) -> bool:
    return ID_PATTERN.match(text) is not None


def id_timestamp_ms(text: str) -> int:
    """The millisecond an id was made (for keyset cursors and debugging)."""
    value = 0
    for char in text:
        value = value * 32 + _ALPHABET.index(char)
    return value >> _RANDOM_BITS


class IdGenerator:
    """Monotonic ULIDs; one per store, never shared between threads."""

    def __init__(self, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._clock_ns = clock_ns
        self._last_ms = -1
        self._last_random = 0

    def new_id(self) -> str:
        now_ms = self._clock_ns() // 1_000_000
        if now_ms <= self._last_ms:
            # Same millisecond (or the clock stepped back): keep increasing.
            now_ms = self._last_ms
            random_part = self._last_random + 1
            if random_part > _RANDOM_MAX:
                now_ms += 1
                random_part = secrets.randbits(_RANDOM_BITS - 1)
        else:
            # One bit of headroom, so increments within a millisecond never overflow in practice.
            random_part = secrets.randbits(_RANDOM_BITS - 1)
        self._last_ms, self._last_random = now_ms, random_part
        return _encode((now_ms << _RANDOM_BITS) | random_part)
