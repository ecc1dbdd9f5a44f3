"""How often an agent whose birth keeps being superseded announces itself again
(edge/agent/birth.py `ReannouncePacer`): at once after a quiet spell, then at intervals
that double up to a cap, so a flood of forgeries cannot make it flood the broker."""

from __future__ import annotations

import itertools

from edge.agent.birth import ReannouncePacer


def test_the_first_repeated_birth_goes_at_once_and_the_next_ones_wait_longer_each_time() -> None:
    pacer = ReannouncePacer(min_interval_s=0.5, max_interval_s=4.0)
    now_s = 100.0
    sent_at: list[float] = []
    for _ in range(7):
        now_s = pacer.earliest_s(now_s)
        sent_at.append(now_s)
        pacer.sent(now_s)

    gaps = [later - earlier for earlier, later in itertools.pairwise(sent_at)]
    assert sent_at[0] == 100.0
    assert gaps == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_after_a_quiet_spell_the_pace_starts_again_from_the_shortest_interval() -> None:
    pacer = ReannouncePacer(min_interval_s=0.5, max_interval_s=4.0)
    for now_s in (0.0, 0.5, 1.5):
        pacer.sent(now_s)
    assert pacer.earliest_s(2.0) == 3.5  # in the middle of a flood: wait

    quiet_s = 1.5 + 2 * 4.0 + 0.1
    assert pacer.earliest_s(quiet_s) == quiet_s
    pacer.sent(quiet_s)
    assert pacer.earliest_s(quiet_s) == quiet_s + 0.5
