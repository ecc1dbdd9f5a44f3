"""Exponential backoff with a cap and full jitter for reconnect loops.

Jitter matters: when a broker restarts, a whole fleet reconnects at once; random
delays spread that thundering herd over the backoff window.
"""

from __future__ import annotations

import random


class Backoff:
    def __init__(
        self,
        initial_s: float,
        max_s: float,
        multiplier: float = 2.0,
        rng: random.Random | None = None,
    ) -> None:
        if initial_s <= 0 or max_s < initial_s or multiplier < 1:
            raise ValueError("need 0 < initial_s <= max_s and multiplier >= 1")
        self._initial_s = initial_s
        self._max_s = max_s
        self._multiplier = multiplier
        self._rng = rng or random.Random()
        self._attempt = 0
        self._exponent = 0

    @property
    def attempt(self) -> int:
        return self._attempt

    def reset(self) -> None:
        self._attempt = 0
        self._exponent = 0

    def ceiling_s(self) -> float:
        """The upper bound of the next delay."""
        return min(self._max_s, self._initial_s * self._multiplier**self._exponent)

    def next_delay_s(self) -> float:
        """A delay drawn uniformly from [initial/2, ceiling]; the ceiling doubles up to the cap."""
        ceiling = self.ceiling_s()
        # Stop growing the exponent once capped: a days-long outage must not overflow it.
        if ceiling < self._max_s:
            self._exponent += 1
        self._attempt += 1
        return self._rng.uniform(min(self._initial_s / 2, ceiling), ceiling)
