"""Hypothesis profiles for the scheduler's property tests.

Registered here and applied per test (``@PROPERTIES``), never loaded globally, so
other packages' tests keep their own settings. ``GREENFED_SCHEDULER_PROFILE=thorough``
searches ten times longer.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {
    "deadline": None,  # timing varies on shared CI machines; never a reason to fail
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile("scheduler-fast", max_examples=100, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("scheduler-thorough", max_examples=1000, **_COMMON)  # type: ignore[arg-type]

PROPERTIES = settings.get_profile(
    "scheduler-" + os.environ.get("GREENFED_SCHEDULER_PROFILE", "fast")
)
