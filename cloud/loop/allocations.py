"""Small views of stored allocations shared by the loop's steps."""

from __future__ import annotations

from collections.abc import Sequence

from cloud.store import AllocationRecord, NewAllocation


def as_new_allocation(record: AllocationRecord) -> NewAllocation:
    """A stored allocation, to keep as it is in a `PlacementWrite` that replaces the set."""
    return NewAllocation(
        member_index=record.member_index,
        node_id=record.node_id,
        accelerator_kind=record.accelerator_kind,
        accelerators=record.accelerators,
        accelerator_ids=record.accelerator_ids,
        host_memory_bytes=record.host_memory_bytes,
        expected_end=record.expected_end,
        borrowed=record.borrowed,
        power_limit_w=record.power_limit_w,
        cpu_cores=record.cpu_cores,
    )


def node_workers(members: Sequence[AllocationRecord]) -> dict[str, list[AllocationRecord]]:
    """A gang's members grouped by node, nodes in the order of their lowest member, each
    node's members in member order.

    Every member is one worker of the gang: ranks count the members in this order (a
    node's first worker is ranked after all the members of the nodes before it), and a
    node's position here is its `NODE_RANK` (cloud/loop/desired.py).
    """
    workers: dict[str, list[AllocationRecord]] = {}
    for member in sorted(members, key=lambda m: m.member_index):
        workers.setdefault(member.node_id, []).append(member)
    return workers


def by_work(allocations: Sequence[AllocationRecord]) -> dict[str, tuple[AllocationRecord, ...]]:
    """Every work item's allocations, in member order."""
    grouped: dict[str, list[AllocationRecord]] = {}
    for allocation in allocations:
        grouped.setdefault(allocation.work_id, []).append(allocation)
    return {
        work_id: tuple(sorted(members, key=lambda m: m.member_index))
        for work_id, members in grouped.items()
    }
