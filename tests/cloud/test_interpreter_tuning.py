"""While the control plane schedules, or serves the API beside a leader that does, the
interpreter favours the event loop; afterwards the process has its settings back."""

from __future__ import annotations

import gc
import sys

from cloud.app_keys import SCHEDULER
from cloud.interpreter_tuning import SWITCH_INTERVAL_S, tuned_for_scheduling
from tests.api.support import running_api
from tests.store.databases import DatabaseUnderTest


def test_scheduling_shortens_the_switch_interval_and_full_collections_then_restores() -> None:
    switch_interval_s, thresholds = sys.getswitchinterval(), gc.get_threshold()
    with tuned_for_scheduling():
        assert sys.getswitchinterval() <= SWITCH_INTERVAL_S
        young, middle, oldest = gc.get_threshold()
        assert (young, middle) == thresholds[:2]  # young generations as they were
        assert oldest >= 100 * thresholds[2]
    assert sys.getswitchinterval() == switch_interval_s
    assert gc.get_threshold() == thresholds


async def test_an_api_only_replica_keeps_full_collections_rare_while_it_serves(
    database: DatabaseUnderTest,
) -> None:
    """A replica with scheduling off holds the whole fleet's registry as the leader does:
    at the default thresholds its full collections stalled the loop serving its pages
    (0.2-0.8 s each, every 10-20 s, at 10,000 nodes)."""
    switch_interval_s, thresholds = sys.getswitchinterval(), gc.get_threshold()
    async with running_api(database) as replica:  # scheduling off
        assert SCHEDULER not in replica.app
        young, middle, oldest = gc.get_threshold()
        assert (young, middle) == thresholds[:2]
        assert oldest >= 100 * thresholds[2]
        assert sys.getswitchinterval() <= SWITCH_INTERVAL_S
    assert sys.getswitchinterval() == switch_interval_s
    assert gc.get_threshold() == thresholds
