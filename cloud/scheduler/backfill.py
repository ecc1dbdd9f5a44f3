"""Reservations for blocked jobs, and the rule that backfill may not delay them.

When a job cannot start now (even with preemption), it reserves the earliest slot
at which enough accelerators will be free, computed from the expected end times
of running work. Each reserved node then records the reserved start and its
*slack*: accelerators that may still go to work running past that start. Work
that ends before the reserved start may use the node freely (backfill); longer
work only within the slack. Slack is kept exact by ``ClusterState`` as work is
placed or evicted, so a reservation can never be pushed back by later jobs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arrays import FloatArray, IntArray
from .candidates import KindCandidates
from .model import KIND_INDEX
from .shape import WorkShape
from .state import NO_RESERVATION, ClusterState


@dataclass(frozen=True, slots=True)
class Slot:
    start_at: float
    nodes: tuple[int, ...]
    amounts: tuple[int, ...]  # accelerators reserved per node
    projected_free: tuple[int, ...]  # free per node at start_at, before this reservation
    ends: tuple[float, ...]  # when the reserved job would finish on each node


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
    cap = shape.max_per_node
    if nodes.size == 0:
        return None
    n = state.snapshot.node_count
    position_of = np.full(n, -1, dtype=np.int64)
    position_of[nodes] = np.arange(nodes.size)
    available = state.free[k][nodes] - state.res_held[k][nodes]

    def slots(amount: IntArray) -> IntArray:
        count: IntArray = np.maximum(amount, 0) // need
        return np.minimum(count, cap) if cap is not None else count

    if int(slots(available).sum()) >= members:
        return None  # capacity is there: something else (affinity, limits) blocks it
    if not state.ending[k][nodes].any() and not state.res_releases[k]:
        return None  # only long-running work there: nothing will free up
    event_pos, event_t, event_amount = [], [], []
    kind = cand.static.kind_code
    ending = np.flatnonzero(state.ending[k][nodes] > 0)
    for position, node in zip(ending.tolist(), nodes[ending].tolist(), strict=True):
        for alloc in state.node_allocs.get(node, {}).values():
            if alloc.expected_end is not None and KIND_INDEX[alloc.accelerator_kind] == kind:
                event_pos.append(position)
                event_t.append(max(alloc.expected_end, state.now))
                event_amount.append(alloc.accelerators)
    # Earlier reservations hold their accelerators from now (conservative) and give
    # them back when their job would end, so reservations can queue behind each other.
    for node, end, held in state.res_releases[kind]:
        position = position_of[node]
        if position >= 0 and end != float("inf"):
            event_pos.append(int(position))
            event_t.append(end)
            event_amount.append(held)
    if not event_pos:
        return None
    pos = np.array(event_pos, dtype=np.int64)
    t = np.array(event_t, dtype=np.float64)
    amount = np.array(event_amount, dtype=np.int64)
    order = np.lexsort((t, pos))  # by node, then time
    pos, t, amount = pos[order], t[order], amount[order]
    running = np.cumsum(amount)
    first = np.r_[True, pos[1:] != pos[:-1]]
    group = np.cumsum(first) - 1
    within = running - (running - amount)[first][group]
    after = available[pos] + within
    gained = slots(after) - slots(after - amount)
    by_time = np.argsort(t, kind="stable")
    reached = int(slots(available).sum()) + np.cumsum(gained[by_time])
    hit = np.flatnonzero(reached >= members)
    if hit.size == 0:
        return None
    start = float(t[by_time][hit[0]])
    released = np.bincount(pos[t <= start], weights=amount[t <= start], minlength=nodes.size)
    at_start = available + released.astype(np.int64)
    per_node = slots(at_start)
    chosen = np.flatnonzero(per_node > 0)
    chosen = chosen[np.lexsort((chosen, -per_node[chosen]))]
    picked, amounts, projected, ends = [], [], [], []
    remaining = members
    for position in chosen.tolist():
        if remaining <= 0:
            break
        take = min(int(per_node[position]), remaining)
        remaining -= take
        picked.append(int(nodes[position]))
        amounts.append(take * need)
        projected.append(int(at_start[position]))
        ends.append(start + float(runtime_s[position]))
    return Slot(start, tuple(picked), tuple(amounts), tuple(projected), tuple(ends))


def reserve(state: ClusterState, k: int, slot: Slot) -> None:
    state.has_reservations = True
    for node, amount, projected, end in zip(
        slot.nodes, slot.amounts, slot.projected_free, slot.ends, strict=True
    ):
        state.res_releases[k].append((node, end, amount))
        slack = projected - amount
        if state.res_start[k][node] == NO_RESERVATION:
            state.res_slack[k][node] = slack
        else:
            state.res_slack[k][node] = min(int(state.res_slack[k][node]) - amount, slack)
        state.res_start[k][node] = min(float(state.res_start[k][node]), slot.start_at)
        state.res_held[k][node] += amount
