"""A training job's retry policy: whether its own failure runs it again, and when.

A worker that exits non-zero (or cannot start) fails the job, unless the job's
``max_retries`` allows another run: it is then queued again, not before a backoff
that starts at ``retry_backoff_s`` and doubles with each failure up to
``MAX_BACKOFF_S`` (as Kubernetes Jobs back off; a base above the cap is kept). These
failures are counted in ``WorkRecord.failures``, apart from the placements that lost
nodes and preemptions end, which ``store.max_attempts`` bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec

from cloud.store import WorkRecord
from cloud.work.convert import spec_of
from cloud.work.specs import TrainingJobSpec

MAX_BACKOFF_S: Final = 3600.0


@dataclass(frozen=True, slots=True)
class Retry:
    """The job runs again: queued with this reason, not placed before ``not_before``."""

    reason: str
    not_before: float


def after_failure(record: WorkRecord, reason: str, now: float) -> Retry | str:
    """What a failure with ``reason`` leads to: a retry, or the job's final reason."""
    try:
        spec = spec_of(record)
    except (msgspec.DecodeError, ValueError):
        return reason  # a spec that cannot be read has no retries to give
    if not isinstance(spec, TrainingJobSpec) or spec.max_retries == 0:
        return reason
    if record.failures >= spec.max_retries:
        return f"{reason} (failed {record.failures + 1} times, {spec.max_retries} retries used)"
    base_s = spec.retry_backoff_s
    wait_s = min(base_s * 2.0**record.failures, max(base_s, MAX_BACKOFF_S))
    retry = record.failures + 1
    return Retry(f"{reason}; retry {retry} of {spec.max_retries} in {wait_s:g} s", now + wait_s)
