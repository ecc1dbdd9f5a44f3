"""The queue as the scheduling leader sees it, for `/metrics` (cloud/metrics.py).

- Pending work by priority class, kind and the scheduler's reason code
  (`cloud.scheduler.plan.PendingCode`, the `code` of a pending explanation; `dependency`
  for work the loop holds back for its dependencies), from the leader's latest pass:
  no query per scrape. A replica that does not lead has no
  figures (its view would be stale), and losing leadership forgets them, so a sum
  over replicas counts the queue once.
- Queue wait (submission or requeue -> placed) and submission -> running, observed
  from the records a commit returns: the store applies a transition once (every
  write carries the version it expects), so a pass planned again, a retried commit
  or another leader never observes the same transition twice.

Only plain integers and floats change here; the collector turns them into series.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, get_args

from cloud.scheduler import PendingCode, Plan
from cloud.store import WorkRecord
from cloud.work.dependencies import NOTHING_WAITS, Resolution
from shared.work_literals import PRIORITY_CLASSES, WORK_KINDS, PriorityClass, WorkKind

PENDING_CODES: Final[tuple[PendingCode, ...]] = get_args(PendingCode)
# Seconds to a day: an interactive job placed at once, a batch job behind a day's queue.
WAIT_BUCKETS_S: Final[tuple[float, ...]] = (1, 5, 15, 60, 300, 900, 3600, 14400, 86400)

PendingKey = tuple[PriorityClass, WorkKind, PendingCode]


@dataclass(frozen=True, slots=True)
class PendingTally:
    """A pass's pending work: each item's code, and the counts by key."""

    codes: dict[str, PendingCode]
    counts: dict[PendingKey, int]


@dataclass(slots=True)
class WaitHistogram:
    """Observations per bucket (not cumulative; the last one is +Inf) and their sum.
    `bounds`: the buckets' upper bounds, seconds, ascending."""

    bounds: tuple[float, ...] = WAIT_BUCKETS_S
    counts: list[int] = field(init=False)
    sum_s: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        index = next(
            (i for i, bound in enumerate(self.bounds) if seconds <= bound), len(self.bounds)
        )
        self.counts[index] += 1
        self.sum_s += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, observations at or below it), as a Prometheus histogram has them."""
        bounds = [str(float(bound)) for bound in self.bounds] + ["+Inf"]
        total = 0
        out = []
        for bound, count in zip(bounds, self.counts, strict=True):
            total += count
            out.append((bound, total))
        return out


def _by_priority() -> dict[PriorityClass, WaitHistogram]:
    return {priority: WaitHistogram() for priority in PRIORITY_CLASSES}


class QueueMetrics:
    def __init__(self) -> None:
        # None: no pass of this leadership yet (or not leading): no series at all.
        self.pending: Mapping[PendingKey, int] | None = None
        self._codes: dict[str, PendingCode] = {}  # the latest pass's, by work id
        self.queue_wait = _by_priority()
        self.submission_to_running = _by_priority()

    def note_pass(
        self,
        plan: Plan,
        records: Mapping[str, WorkRecord],
        dependencies: Resolution = NOTHING_WAITS,
    ) -> None:
        """`dependencies`: work the loop held back for its dependencies (code
        `dependency`), which the core never saw."""
        self.take(self.tally(plan, records, dependencies))

    def tally(
        self,
        plan: Plan,
        records: Mapping[str, WorkRecord],
        dependencies: Resolution = NOTHING_WAITS,
    ) -> PendingTally:
        """What `note_pass` takes in, changing nothing: for a worker thread (it walks
        the whole queue), the loop then `take`s it."""
        counts = dict.fromkeys(
            (
                (priority, kind, code)
                for priority in PRIORITY_CLASSES
                for kind in WORK_KINDS
                for code in PENDING_CODES
            ),
            0,
        )
        # Work a bounded pass did not decide counts under the code of the last pass that
        # did; work no pass decided yet waits behind the head of the queue: capacity.
        codes: dict[str, PendingCode] = {p.work_id: p.code for p in plan.pending}
        previous = self._codes
        for work_id in plan.undecided:
            codes[work_id] = previous.get(work_id, "capacity")
        for work_id, code in codes.items():
            record = records.get(work_id)
            if record is not None:
                counts[(record.priority, record.kind, code)] += 1
        for work_id in dependencies.waiting:
            record = records.get(work_id)
            if record is not None:
                counts[(record.priority, record.kind, "dependency")] += 1
        return PendingTally(codes, counts)

    def take(self, tally: PendingTally) -> None:
        self._codes = tally.codes
        self.pending = tally.counts

    def forget_pending(self) -> None:
        self.pending = None
        self._codes = {}

    def note_commit(
        self, before: Mapping[str, WorkRecord], committed: Iterable[WorkRecord]
    ) -> None:
        """Observe what one commit changed: `before` is the pass's snapshot of the work,
        `committed` the records the store wrote (stamped with the commit's time)."""
        for record in committed:
            previous = before.get(record.work_id)
            if previous is None:
                continue
            if previous.state == "pending" and record.state == "scheduled":
                # Waiting since submission, or since the eviction that requeued it (a
                # pending reason is written without touching updated_at).
                since = previous.submitted_at if previous.attempts == 0 else previous.updated_at
                self.queue_wait[record.priority].observe(record.updated_at - since)
            elif (
                previous.state == "scheduled"
                and record.state in ("running", "succeeded")  # succeeded: ran in between
                and record.attempts == 1
            ):
                # The first placement only: a requeued item's next wait is queue wait.
                self.submission_to_running[record.priority].observe(
                    record.updated_at - record.submitted_at
                )
