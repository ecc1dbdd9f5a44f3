"""What the live loop does when an extension hook fails for a job.

The scheduler core leaves that one job pending (code ``hook-failed``) and decides the
rest of the pass; the job's own reason says what happened to it. This says that an
extension is broken: every such job is counted (``greenfed_scheduling_hook_failures``)
and each distinct failure (hook, name, error type) is logged at most once per
``log_interval_s``, since a hook that fails for a job fails for it every pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import structlog

from cloud.scheduler import Plan

LOG_INTERVAL_S: Final = 60.0


class HookFailureLog:
    def __init__(
        self, monotonic: Callable[[], float], *, log_interval_s: float = LOG_INTERVAL_S
    ) -> None:
        self._monotonic = monotonic
        self._log_interval_s = log_interval_s
        # (hook, name, error) -> when that failure was last logged (monotonic).
        self._logged_at: dict[tuple[str, str, str], float] = {}
        self._log = structlog.get_logger("greenfed.loop")
        self.total = 0  # work items left pending by a failing hook, over every pass

    def note(self, plan: Plan) -> None:
        now_s = self._monotonic()
        for pending in plan.pending:
            failure = pending.hook_failure
            if failure is None:
                continue
            self.total += 1
            key = (failure.hook, failure.name, failure.error)
            last_s = self._logged_at.get(key)
            if last_s is not None and now_s - last_s < self._log_interval_s:
                continue
            self._logged_at[key] = now_s
            self._log.error(
                "scheduling hook failed",
                hook=failure.hook,
                name=failure.name,
                error=failure.error,
                detail=failure.detail,
                work_id=pending.work_id,
            )
