"""The work state machine: declared once, enforced by every store operation."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloud.store import (
    EvictionWrite,
    IllegalTransitionError,
    InvalidPassWriteError,
    PassWrite,
    Store,
    TenantRecord,
    VersionConflictError,
    WorkRecord,
)
from cloud.store.states import TERMINAL_STATES, TRANSITIONS, is_legal, requeue
from shared.work_literals import WORK_STATES, WorkState
from tests.store.builders import placement, submit

NON_TERMINAL = [state for state in WORK_STATES if state not in TERMINAL_STATES]


def test_terminal_states_have_no_way_out() -> None:
    for state in TERMINAL_STATES:
        assert TRANSITIONS[state] == frozenset()


def test_every_non_terminal_state_can_be_cancelled() -> None:
    assert all(is_legal(state, "cancelled") for state in NON_TERMINAL)


def test_the_declared_transitions() -> None:
    legal = {(a, b) for a, b in itertools.product(WORK_STATES, WORK_STATES) if is_legal(a, b)}
    assert legal == {
        ("pending", "scheduled"),
        ("pending", "failed"),
        ("pending", "cancelled"),
        ("scheduled", "running"),
        ("scheduled", "pending"),
        ("scheduled", "failed"),
        ("scheduled", "cancelled"),
        ("running", "succeeded"),
        ("running", "failed"),
        ("running", "pending"),
        ("running", "cancelled"),
    }


def test_requeues_are_bounded() -> None:
    assert requeue(1, 3, "preempted by p0 job x").to_state == "pending"
    gave_up = requeue(3, 3, "node gpu-7 lost")
    assert gave_up.to_state == "failed"
    assert gave_up.reason == "node gpu-7 lost (gave up after 3 attempts)"


# One step of a random history: a state change, a requeue, or a placement.
Step = tuple[str, WorkState | None]
STEPS = st.one_of(
    st.tuples(st.just("transition"), st.sampled_from(WORK_STATES)),
    st.tuples(st.just("requeue"), st.none()),
    st.tuples(st.just("place"), st.none()),
)


def _model(state: WorkState, attempts: int, step: Step, max_attempts: int) -> WorkState | None:
    """The expected next state, or None when the store must refuse the step."""
    action, target = step
    if action == "place":
        if state == "pending":
            return "scheduled"
        return state if state in ("scheduled", "running") else None
    if action == "requeue":
        if state not in ("scheduled", "running"):
            return None
        return requeue(attempts, max_attempts, "lost").to_state
    assert target is not None
    if target == "scheduled":
        return None  # only a placement schedules work
    return target if is_legal(state, target) else None


async def _apply(store: Store, work: WorkRecord, step: Step) -> WorkRecord:
    action, target = step
    if action == "place":
        lease = await store.try_acquire_leadership()
        assert lease is not None
        async with lease:
            result = await store.commit_pass(
                PassWrite(placements=(placement(work.work_id, "node-a"),)), lease=lease
            )
    elif action == "requeue":
        result = await store.requeue(work.work_id, "lost")
    else:
        assert target is not None
        result = await store.transition(work.work_id, target)
    return result.work[0]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=st.lists(STEPS, min_size=1, max_size=10))
async def test_random_histories_never_reach_an_illegal_state(
    store: Store, tenant: TenantRecord, steps: list[Step]
) -> None:
    work = (await submit(store, tenant.tenant_id)).work
    state, attempts = work.state, work.attempts
    for step in steps:
        expected = _model(state, attempts, step, max_attempts=3)
        if expected is None:
            with pytest.raises((IllegalTransitionError, InvalidPassWriteError)):
                await _apply(store, work, step)
        else:
            work = await _apply(store, work, step)
            if step[0] == "place" and state == "pending":
                attempts += 1
            assert work.state == expected
            state = expected
        stored = await store.find_work(work.work_id)
        assert stored is not None
        assert (stored.state, stored.attempts) == (state, attempts)
        allocations = await store.work_allocations(tenant.tenant_id, work.work_id)
        # Work holds allocations exactly while it is scheduled or running.
        assert bool(allocations) == (state in ("scheduled", "running"))


async def test_requeued_work_fails_with_the_reason_after_max_attempts(
    store: Store, tenant: TenantRecord
) -> None:
    work = (await submit(store, tenant.tenant_id)).work
    lease = await store.try_acquire_leadership()
    assert lease is not None
    reasons = []
    for _ in range(3):
        await store.commit_pass(PassWrite(placements=(placement(work.work_id, "n1"),)), lease=lease)
        requeued = (await store.requeue(work.work_id, "preempted by p0 job j9")).work[0]
        reasons.append((requeued.state, requeued.state_reason, requeued.attempts))
    await lease.release()
    assert reasons == [
        ("pending", "preempted by p0 job j9", 1),
        ("pending", "preempted by p0 job j9", 2),
        ("failed", "preempted by p0 job j9 (gave up after 3 attempts)", 3),
    ]


async def test_an_illegal_transition_names_both_states_and_changes_nothing(
    store: Store, tenant: TenantRecord
) -> None:
    work = (await submit(store, tenant.tenant_id)).work
    with pytest.raises(IllegalTransitionError, match="pending -> succeeded") as error:
        await store.transition(work.work_id, "succeeded")
    assert (error.value.from_state, error.value.to_state) == ("pending", "succeeded")
    assert await store.find_work(work.work_id) == work


async def test_a_stale_version_is_a_conflict(store: Store, tenant: TenantRecord) -> None:
    work = (await submit(store, tenant.tenant_id)).work
    await store.cancel_work(tenant.tenant_id, work.work_id, expected_version=work.version)
    other = (await submit(store, tenant.tenant_id)).work
    await store.transition(other.work_id, "failed", reason="image missing")
    with pytest.raises(VersionConflictError, match=other.work_id):
        await store.transition(other.work_id, "cancelled", expected_version=other.version)


async def test_an_agent_event_is_applied_once(store: Store, tenant: TenantRecord) -> None:
    work = (await submit(store, tenant.tenant_id)).work
    lease = await store.try_acquire_leadership()
    assert lease is not None
    await store.commit_pass(PassWrite(placements=(placement(work.work_id, "n1"),)), lease=lease)
    await lease.release()
    first = await store.transition(work.work_id, "running", event_id="agent-n1-000042")
    again = await store.transition(work.work_id, "running", event_id="agent-n1-000042")
    assert (first.duplicate, first.work[0].state) == (False, "running")
    assert (again.duplicate, again.work) == (True, ())
    done = await store.transition(work.work_id, "succeeded", event_id="agent-n1-000043")
    assert done.work[0].state == "succeeded"
    resent = await store.transition(work.work_id, "succeeded", event_id="agent-n1-000043")
    assert resent.duplicate


async def test_a_retried_failure_counts_apart_from_infrastructure_losses(
    store: Store, tenant: TenantRecord
) -> None:
    """Three failures retried by the job's policy leave all of `store.max_attempts` (3)
    for lost nodes and preemptions: the job is still requeued after two of those."""
    work = (await submit(store, tenant.tenant_id)).work
    lease = await store.try_acquire_leadership()
    assert lease is not None

    async def place_then(eviction: EvictionWrite) -> WorkRecord:
        await store.commit_pass(PassWrite(placements=(placement(work.work_id, "n1"),)), lease=lease)
        placed = await store.find_work(work.work_id)
        assert placed is not None
        assert placed.not_before is None  # placing it ends its backoff
        return (await store.commit_pass(PassWrite(evictions=(eviction,)), lease=lease)).work[0]

    for failure in range(1, 4):
        retried = await place_then(
            EvictionWrite(
                work_id=work.work_id, reason=f"exit code 3; retry {failure}", retry_not_before=50.0
            )
        )
        assert (retried.state, retried.failures, retried.not_before) == ("pending", failure, 50.0)
    for _ in range(2):
        lost = await place_then(EvictionWrite(work_id=work.work_id, reason="node n1 lost"))
        assert (lost.state, lost.failures, lost.not_before) == ("pending", 3, None)
    final = await place_then(EvictionWrite(work_id=work.work_id, reason="node n1 lost"))
    await lease.release()
    assert (final.state, final.attempts) == ("failed", 6)
    assert final.state_reason == "node n1 lost (gave up after 3 attempts)"
