"""Reservations for blocked jobs, and the rule that backfill may not delay them.

When a job cannot start now (even with preemption), it reserves the earliest slot
at which enough accelerators (and, if it needs any, host memory and CPU cores
beside its accelerators) will be free, computed from the expected end times of
running work. Each reserved node then records the reserved start and its *slack*:
accelerators, host memory and cores that may still go to work running past that
start. Cores are the node's CPU pool, so a job's reserved cores are a reservation
in the CPU column: CPU work and other jobs' cores see the same slack. Work that
ends before the reserved start may use the node freely (backfill); longer work
only within the slack. Slack is kept exact by ``ClusterState`` as work is placed
or evicted, so a reservation can never be pushed back by later jobs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arrays import FloatArray, IntArray
from .candidates import KindCandidates
from .model import Held
from .shape import WorkShape
from .snapshot import CPU_COLUMN
from .state import NO_RESERVATION, ClusterState, ReservedSpan


@dataclass(frozen=True, slots=True)
class Slot:
    start_at: float
    nodes: tuple[int, ...]
    amounts: tuple[int, ...]  # accelerators reserved per node
    host_memory_bytes: tuple[int, ...]  # host memory reserved per node
    cpu_cores: tuple[int, ...]  # CPU cores reserved per node beside the accelerators
    projected_free: tuple[int, ...]  # accelerators free per node at start_at, before this
    projected_host_free: tuple[int, ...]  # host memory bytes free then, likewise
    projected_cpu_free: tuple[int, ...]  # CPU cores free then, likewise
    ends: tuple[float, ...]  # when the reserved job would finish on each node


def _any_kind(shape: WorkShape, k: int) -> bool:
    """Can work of another kind free what the job needs: host memory, or CPU cores
    (held beside GPU/NPU devices as well as by CPU work)?"""
    return bool(shape.host_memory_bytes or shape.cpu_cores) or k == CPU_COLUMN


def _cores_of(state: ClusterState, alloc: Held, node: int) -> int:
    """CPU cores ``alloc`` holds on ``node``: beside its devices, or as its accelerators."""
    held = alloc.accelerators if state.column_of(alloc, node) == CPU_COLUMN else 0
    return held + alloc.cpu_cores


def may_free_up(state: ClusterState, shape: WorkShape, cand: KindCandidates) -> bool:
    """Will anything the job needs come free on its candidate nodes: work with an
    expected end (of its kind, or of any kind when host memory or CPU cores are
    involved), or an earlier reservation ending?"""
    k = cand.k
    nodes = cand.nodes
    if state.ending_allocation_count[k][nodes].any() or state.reserved_spans[k]:
        return True
    if not _any_kind(shape, k):
        return False
    return any(
        state.ending_allocation_count[other][nodes].any() or state.reserved_spans[other]
        for other in range(len(state.reserved_spans))
        if other != k
    )


def earliest_slot(
    state: ClusterState,
    shape: WorkShape,
    cand: KindCandidates,
    runtime_s: FloatArray,
    members: int,
) -> Slot | None:
    """Earliest time ``members`` members fit on ``cand``'s nodes, or None if never
    (capacity held by work with no expected end)."""
    k = cand.k
    nodes = cand.nodes
    need = shape.accelerators
    host_need = shape.host_memory_bytes
    cpu_need = shape.cpu_cores  # 0 for a CPU job: its cores are its accelerators
    cap = shape.max_per_node
    if nodes.size == 0:
        return None
    n = state.snapshot.node_count
    position_of = np.full(n, -1, dtype=np.int64)
    position_of[nodes] = np.arange(nodes.size)
    available = state.free[k][nodes] - state.reserved_accelerators[k][nodes]
    host_available = state.host_free[nodes] - state.reserved_host_memory_bytes[nodes]
    cpu_available = (
        state.free[CPU_COLUMN][nodes] - state.reserved_accelerators[CPU_COLUMN][nodes]
        if cpu_need
        else np.zeros(nodes.size, dtype=np.int64)
    )

    def slots(amount: IntArray, host: IntArray, cores: IntArray) -> IntArray:
        count: IntArray = np.maximum(amount, 0) // need
        if host_need:
            count = np.minimum(count, np.maximum(host, 0) // host_need)
        if cpu_need:
            count = np.minimum(count, np.maximum(cores, 0) // cpu_need)
        return np.minimum(count, cap) if cap is not None else count

    if int(slots(available, host_available, cpu_available).sum()) >= members:
        return None  # capacity is there: something else (affinity, limits) blocks it
    if not may_free_up(state, shape, cand):
        return None  # only long-running work there: nothing will free up
    event_pos: list[int] = []
    event_t: list[float] = []
    event_amount: list[int] = []
    event_host: list[int] = []
    event_cores: list[int] = []
    kinds = range(len(state.reserved_spans)) if _any_kind(shape, k) else (k,)
    ending = np.zeros(nodes.size, dtype=np.bool_)
    for kind in kinds:
        ending |= state.ending_allocation_count[kind][nodes] > 0
    where = np.flatnonzero(ending)
    for position, node in zip(where.tolist(), nodes[where].tolist(), strict=True):
        for alloc in state.node_allocs.get(node, {}).values():
            if alloc.expected_end is None:
                continue
            same_kind = state.column_of(alloc, node) == k
            # A CPU job gets back the cores GPU/NPU work held beside its devices.
            freed = (alloc.accelerators if same_kind else 0) + (
                alloc.cpu_cores if k == CPU_COLUMN else 0
            )
            host = alloc.host_memory_bytes if host_need else 0
            freed_cores = _cores_of(state, alloc, node) if cpu_need else 0
            if freed or host or freed_cores:
                event_pos.append(position)
                event_t.append(max(alloc.expected_end, state.now))
                event_amount.append(freed)
                event_host.append(host)
                event_cores.append(freed_cores)
    # Earlier reservations hold their accelerators, host memory and cores from now
    # (conservative) and give them back when their job would end, so reservations
    # can queue behind each other.
    for kind in kinds:
        span: ReservedSpan
        for span in state.reserved_spans[kind]:
            position = int(position_of[span.node])
            if position >= 0 and span.end_s != float("inf"):
                event_pos.append(position)
                event_t.append(span.end_s)
                event_amount.append(span.accelerators if kind == k else 0)
                event_host.append(span.host_memory_bytes if host_need else 0)
                event_cores.append(span.accelerators if cpu_need and kind == CPU_COLUMN else 0)
    if not event_pos:
        return None
    pos = np.array(event_pos, dtype=np.int64)
    t = np.array(event_t, dtype=np.float64)
    amount = np.array(event_amount, dtype=np.int64)
    host_amount = np.array(event_host, dtype=np.int64)
    cpu_amount = np.array(event_cores, dtype=np.int64)
    order = np.lexsort((t, pos))  # by node, then time
    pos, t = pos[order], t[order]
    amount, host_amount, cpu_amount = amount[order], host_amount[order], cpu_amount[order]
    first = np.r_[True, pos[1:] != pos[:-1]]
    group = np.cumsum(first) - 1

    def freed_by_then(amounts: IntArray) -> IntArray:
        """Per event: what its node has got back up to and including it."""
        running = np.cumsum(amounts)
        result: IntArray = running - (running - amounts)[first][group]
        return result

    after = available[pos] + freed_by_then(amount)
    host_after = host_available[pos] + freed_by_then(host_amount)
    cpu_after = cpu_available[pos] + freed_by_then(cpu_amount)
    gained = slots(after, host_after, cpu_after) - slots(
        after - amount, host_after - host_amount, cpu_after - cpu_amount
    )
    by_time = np.argsort(t, kind="stable")
    reached = int(slots(available, host_available, cpu_available).sum()) + np.cumsum(
        gained[by_time]
    )
    hit = np.flatnonzero(reached >= members)
    if hit.size == 0:
        return None
    start = float(t[by_time][hit[0]])
    due = t <= start
    released = np.bincount(pos[due], weights=amount[due], minlength=nodes.size)
    host_released = np.bincount(pos[due], weights=host_amount[due], minlength=nodes.size)
    cpu_released = np.bincount(pos[due], weights=cpu_amount[due], minlength=nodes.size)
    at_start = available + released.astype(np.int64)
    host_at_start = host_available + host_released.astype(np.int64)
    cpu_at_start = cpu_available + cpu_released.astype(np.int64)
    per_node = slots(at_start, host_at_start, cpu_at_start)
    chosen = np.flatnonzero(per_node > 0)
    chosen = chosen[np.lexsort((chosen, -per_node[chosen]))]
    picked, amounts, hosts, cores, ends = [], [], [], [], []
    projected, projected_host, projected_cpu = [], [], []
    remaining = members
    for position in chosen.tolist():
        if remaining <= 0:
            break
        take = min(int(per_node[position]), remaining)
        remaining -= take
        picked.append(int(nodes[position]))
        amounts.append(take * need)
        hosts.append(take * host_need)
        cores.append(take * cpu_need)
        projected.append(int(at_start[position]))
        projected_host.append(int(host_at_start[position]))
        projected_cpu.append(int(cpu_at_start[position]))
        ends.append(start + float(runtime_s[position]))
    return Slot(
        start,
        tuple(picked),
        tuple(amounts),
        tuple(hosts),
        tuple(cores),
        tuple(projected),
        tuple(projected_host),
        tuple(projected_cpu),
        tuple(ends),
    )


def reserve(state: ClusterState, k: int, slot: Slot) -> None:
    state.has_reservations = True
    for node, amount, host, cores, projected, projected_host, projected_cpu, end in zip(
        slot.nodes,
        slot.amounts,
        slot.host_memory_bytes,
        slot.cpu_cores,
        slot.projected_free,
        slot.projected_host_free,
        slot.projected_cpu_free,
        slot.ends,
        strict=True,
    ):
        state.reserved_spans[k].append(ReservedSpan(node, end, amount, host))
        _hold(state, k, node, amount, projected, slot.start_at)
        if cores:
            # The CPU pool's reservation: CPU work and other jobs' cores keep to its slack.
            state.reserved_spans[CPU_COLUMN].append(ReservedSpan(node, end, cores, 0))
            _hold(state, CPU_COLUMN, node, cores, projected_cpu, slot.start_at)
        if host:
            host_slack = projected_host - host
            if state.reservation_host_start_s[node] == NO_RESERVATION:
                state.reservation_slack_host_memory_bytes[node] = host_slack
            else:
                state.reservation_slack_host_memory_bytes[node] = min(
                    int(state.reservation_slack_host_memory_bytes[node]) - host, host_slack
                )
            state.reservation_host_start_s[node] = min(
                float(state.reservation_host_start_s[node]), slot.start_at
            )
            state.reserved_host_memory_bytes[node] += host


def _hold(
    state: ClusterState, k: int, node: int, amount: int, projected: int, start_at: float
) -> None:
    """Reserve ``amount`` of column ``k`` on ``node`` from ``start_at``."""
    slack = projected - amount
    if state.reservation_start_s[k][node] == NO_RESERVATION:
        state.reservation_slack_accelerators[k][node] = slack
    else:
        state.reservation_slack_accelerators[k][node] = min(
            int(state.reservation_slack_accelerators[k][node]) - amount, slack
        )
    state.reservation_start_s[k][node] = min(float(state.reservation_start_s[k][node]), start_at)
    state.reserved_accelerators[k][node] += amount
