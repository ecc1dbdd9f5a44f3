"""Reconnect backoff: capped, doubling, jittered, resettable."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.backoff import Backoff


@given(
    initial_s=st.floats(min_value=0.001, max_value=10),
    cap_factor=st.floats(min_value=1, max_value=1000),
    multiplier=st.floats(min_value=1, max_value=4),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_delays_never_exceed_the_cap_nor_fall_below_half_the_initial_delay(
    initial_s: float, cap_factor: float, multiplier: float, seed: int
) -> None:
    max_s = initial_s * cap_factor
    backoff = Backoff(initial_s, max_s, multiplier, rng=random.Random(seed))
    for _ in range(60):
        delay_s = backoff.next_delay_s()
        assert initial_s / 2 <= delay_s <= max_s


def test_the_ceiling_doubles_after_each_attempt_until_it_reaches_the_cap() -> None:
    backoff = Backoff(0.5, 10.0, rng=random.Random(1))
    ceilings = []
    for _ in range(8):
        ceilings.append(backoff.ceiling_s())
        backoff.next_delay_s()
    assert ceilings == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_each_delay_stays_under_the_ceiling_in_force_for_its_attempt() -> None:
    backoff = Backoff(1.0, 64.0, rng=random.Random(7))
    for _ in range(10):
        ceiling_s = backoff.ceiling_s()
        assert backoff.next_delay_s() <= ceiling_s


def test_attempts_are_counted() -> None:
    backoff = Backoff(1.0, 4.0, rng=random.Random(0))
    for _ in range(3):
        backoff.next_delay_s()
    assert backoff.attempt == 3


def test_reset_starts_over_from_the_initial_delay() -> None:
    backoff = Backoff(0.5, 30.0, rng=random.Random(3))
    for _ in range(10):
        backoff.next_delay_s()
    assert backoff.ceiling_s() == 30.0

    backoff.reset()

    assert backoff.attempt == 0
    assert backoff.ceiling_s() == 0.5
    assert backoff.next_delay_s() <= 0.5


def test_jitter_spreads_the_delays_at_the_cap() -> None:
    backoff = Backoff(1.0, 8.0, rng=random.Random(11))
    for _ in range(4):
        backoff.next_delay_s()  # reach the cap
    delays = [backoff.next_delay_s() for _ in range(50)]
    assert len(set(delays)) > 40
    # Spread over the window, not bunched at one end of it.
    assert min(delays) < 3.0
    assert max(delays) > 6.0


def test_agents_with_different_random_sources_wait_different_times() -> None:
    fleet = [Backoff(1.0, 30.0, rng=random.Random(seed)) for seed in range(20)]
    first_delays = {backoff.next_delay_s() for backoff in fleet}
    assert len(first_delays) == 20


def test_the_same_seed_gives_the_same_delays() -> None:
    first = Backoff(0.5, 30.0, rng=random.Random(5))
    second = Backoff(0.5, 30.0, rng=random.Random(5))
    assert [first.next_delay_s() for _ in range(12)] == [second.next_delay_s() for _ in range(12)]


def test_a_multiplier_of_one_keeps_a_constant_ceiling() -> None:
    backoff = Backoff(2.0, 2.0, multiplier=1.0, rng=random.Random(0))
    for _ in range(5):
        assert 1.0 <= backoff.next_delay_s() <= 2.0


def test_a_very_long_outage_keeps_returning_capped_delays() -> None:
    backoff = Backoff(0.5, 30.0, rng=random.Random(0))
    for _ in range(2000):
        assert backoff.next_delay_s() <= 30.0


@pytest.mark.parametrize(
    ("initial_s", "max_s", "multiplier"),
    [
        (0.0, 1.0, 2.0),
        (-1.0, 1.0, 2.0),
        (2.0, 1.0, 2.0),
        (1.0, 10.0, 0.5),
        (1.0, 10.0, 0.0),
    ],
)
def test_invalid_arguments_are_rejected(initial_s: float, max_s: float, multiplier: float) -> None:
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(initial_s, max_s, multiplier)
