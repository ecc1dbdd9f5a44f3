"""While the control plane schedules, the interpreter favours the event loop; afterwards
the process has its settings back."""

from __future__ import annotations

import gc
import sys

from cloud.interpreter_tuning import SWITCH_INTERVAL_S, tuned_for_scheduling


def test_scheduling_shortens_the_switch_interval_and_full_collections_then_restores() -> None:
    switch_interval_s, thresholds = sys.getswitchinterval(), gc.get_threshold()
    with tuned_for_scheduling():
        assert sys.getswitchinterval() <= SWITCH_INTERVAL_S
        young, middle, oldest = gc.get_threshold()
        assert (young, middle) == thresholds[:2]  # young generations as they were
        assert oldest >= 100 * thresholds[2]
    assert sys.getswitchinterval() == switch_interval_s
    assert gc.get_threshold() == thresholds
