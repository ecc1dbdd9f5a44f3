"""The order in which pending work is considered.

Priority class first (p0, p1, p2); within a class, the tenant with the smallest
dominant resource share goes first (DRF: usage relative to nominal quota, the
largest over accelerator kinds; usage is what it holds now plus its decayed past
usage, and under a cohort tree the smallest share is taken level by level from the
top: fair_share.py), then submission time, then work id. Shares are live: each
placement or eviction re-ranks the tenants it touched (in a tree, every tenant of
that tree), so a tenant that just got capacity yields to the others.

Starvation guard (policy): work pending longer than ``starvation_guard_s`` goes
before all non-aged work of its class, oldest first.

``fair=False`` (``Policy.queue_order="fifo"``) drops the DRF share: within a
priority class, work goes strictly in submission order.

Deadline guard (policy, off by default): a training job that must start within
``deadline_guard_s`` to meet its deadline on the slowest accelerator of its kind
(or to keep within its ``max_delay_s``) goes before everything else in its class,
most urgent first; temporal shifting holds such jobs back until close to that
point, so when it comes they must not queue behind others.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence

from .fair_share import ShareBook
from .model import KIND_INDEX, PRIORITY_RANK, TrainingJob, Work
from .quota import QuotaBook
from .state import ClusterState

# (rank, lane class, shares from the top of the tree or (latest start,), submitted at,
# work id, tenant, version)
_Entry = tuple[int, int, tuple[float, ...], float, str, str, int]


def _by_submission(work: Work) -> tuple[float, str]:
    return (work.submitted_at, work.work_id)


class QueueOrder:
    def __init__(
        self,
        works: Sequence[Work],
        state: ClusterState,
        quota: QuotaBook,
        starvation_guard_s: float | None,
        *,
        fair: bool = True,
        deadline_guard_s: float | None = None,
    ) -> None:
        self._state = state
        self._fair = fair
        self._urgent_before = state.now + deadline_guard_s if deadline_guard_s is not None else None
        # Per kind, over all its pool columns.
        nodes = state.snapshot.nodes
        self._slowest = [
            min(
                (
                    float(pools.relative_speed[pools.capacity > 0].min())
                    for pools in (nodes.kinds[c] for c in columns)
                    if pools.capacity.any()
                ),
                default=1.0,
            )
            for columns in nodes.kind_columns
        ]
        self._quota = quota
        capacity = [
            max(sum(int(nodes.kinds[c].capacity.sum()) for c in columns), 1)
            for columns in nodes.kind_columns
        ]
        self._shares = ShareBook(quota.tree, quota.nominals, capacity, state.snapshot.past_usage)
        aged_before = (
            state.now - starvation_guard_s if starvation_guard_s is not None else float("-inf")
        )
        self._aged_before = aged_before
        lanes: dict[tuple[int, str], list[Work]] = {}
        for work in works:
            lanes.setdefault((PRIORITY_RANK[work.priority], work.tenant), []).append(work)
        order = self._lane_key if self._urgent_before is not None else _by_submission
        self._lanes = {key: deque(sorted(lane, key=order)) for key, lane in sorted(lanes.items())}
        self._version = dict.fromkeys(self._lanes, 0)
        self._heap: list[_Entry] = []
        # Lanes whose heap entry is out of date; re-pushed (once) before the next pop.
        self._dirty: set[tuple[int, str]] = set(self._lanes)

    def dominant_share(self, tenant: str) -> float:
        return self._shares.tenant_share(tenant, self._state.tenant_usage.get(tenant))

    def _refresh(self) -> None:
        keys: dict[str, tuple[float, ...]] = {}
        cohort_shares: dict[str, float] = {}
        for key in sorted(self._dirty):
            self._version[key] += 1
            lane = self._lanes[key]
            if not lane:
                continue
            head = lane[0]
            rank, tenant = key
            version = self._version[key]
            urgent = self._latest_start(head) if self._urgent_before is not None else None
            entry: _Entry
            if urgent is not None:
                entry = (rank, -1, (urgent,), head.submitted_at, head.work_id, tenant, version)
            elif not self._fair:
                entry = (rank, 1, (), head.submitted_at, head.work_id, tenant, version)
            elif head.submitted_at <= self._aged_before:
                entry = (rank, 0, (), head.submitted_at, head.work_id, tenant, version)
            else:
                shares = keys.get(tenant)
                if shares is None:
                    shares = keys[tenant] = self._shares.sort_key(
                        tenant, self._state.tenant_usage, cohort_shares
                    )
                entry = (rank, 1, shares, head.submitted_at, head.work_id, tenant, version)
            heapq.heappush(self._heap, entry)
        self._dirty.clear()

    def _lane_key(self, work: Work) -> tuple[int, float, float, str]:
        """With the deadline guard: urgent jobs first, most urgent first, then FIFO."""
        latest = self._latest_start(work)
        if latest is not None:
            return (0, latest, work.submitted_at, work.work_id)
        return (1, 0.0, work.submitted_at, work.work_id)

    def _latest_start(self, work: Work) -> float | None:
        """The job's latest safe start if the deadline guard makes it urgent, else None."""
        if self._urgent_before is None or not isinstance(work, TrainingJob) or not work.flexible:
            return None
        slowest = self._slowest[KIND_INDEX[work.accelerator_kind]]
        latest = work.latest_start(work.duration_s / slowest)
        return latest if latest <= self._urgent_before else None

    def pop(self) -> Work | None:
        if self._dirty:
            self._refresh()
        while self._heap:
            rank, _, _, _, _, tenant, version = heapq.heappop(self._heap)
            key = (rank, tenant)
            if version != self._version[key] or not self._lanes[key]:
                continue  # stale: the tenant's share or head changed since
            work = self._lanes[key].popleft()
            self._dirty.add(key)
            return work
        return None

    def shares_changed(self, tenants: Iterable[str]) -> None:
        touched = set(tenants)
        tree = self._quota.tree
        if tree is not None and self._fair:
            # A tenant's usage moves its cohorts' shares, and so every tenant of its tree.
            roots = {tree.root_of(t) for t in touched if tree.manages(t)}
            touched |= {t for t in tree.tenant_names if tree.root_of(t) in roots}
        for tenant in touched:
            for rank in range(len(PRIORITY_RANK)):
                key = (rank, tenant)
                if self._lanes.get(key):
                    self._dirty.add(key)
