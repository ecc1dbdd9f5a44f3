"""Incremental scheduling passes against full ones, on randomised histories (issue 28).

A pass of the loop reuses what the last one built: the store re-reads only work whose
version moved (`Store.load_snapshot(previous)`), converted specs are kept by (work id,
version) (`ConversionCache`), each node's scheduler view while what it is made from
holds (`NodeViews`) and the node columns, patched where only utilisation moved
(`NodeTableCache`); within a pass the grid terms keep window means
(cloud/green/terms.py) and capacity waiting keeps timelines (cloud/green/waiting.py).
None of it may change a decision: after every step of a random history (submissions of
random shapes, priorities, tenants, windows and dependencies, cancellations, holds and
releases, passes committed through the store, evictions and retries, jobs starting and ending,
deployments rescaled, nodes changing state, samples, labels and cordons, joining and
leaving, quotas changing, time passing, across a change of daylight saving time) the
inputs built incrementally, with the caches carried from step to step as the loop
carries them, equal the inputs built from scratch, on SQLite and on PostgreSQL; and so
do the plans and moves that `schedule_then_move` makes of them under the green policy
(shifting, capacity waiting, migration and power capping), the one from scratch with
its memos switched off.

A bounded pass (`max_decisions`, docs/scheduling.md "Bounded passes") decides the head
of the queue in its order: the first k decisions of the whole pass, and nothing else.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cloud.fleet.registry import NodeRecord
from cloud.green.latency import ServingLatency, default_latency_estimator
from cloud.green.pass_rule import PassDecision, schedule_then_move
from cloud.green.policies import GreenInputs, build_migrator, build_policy, build_power_capper
from cloud.green.terms import CarbonTerm, PriceTerm
from cloud.green.waiting import CapacityWaiter
from cloud.loop.inputs import ConversionCache, PassInputs, build_inputs
from cloud.loop.moves import running_jobs
from cloud.loop.nodes import NodeViews
from cloud.loop.plans import translate
from cloud.scheduler import Policy, schedule
from cloud.signals.datasets import HourlyTrace, shipped_traces
from cloud.signals.grid import GridSignals, ZoneSeries
from cloud.store import (
    EvictionWrite,
    LeadershipLease,
    NewDependency,
    NewTenant,
    NodeAdminRecord,
    PassWrite,
    StateWrite,
    Store,
    StoreSnapshot,
    TenantChanges,
    TenantRecord,
    WorkRecord,
    open_store,
)
from cloud.store.states import HoldKind
from shared.messages import AcceleratorKind, AcceleratorSample, Telemetry
from shared.work_literals import PriorityClass
from tests.loop.builders import allocation, node, work
from tests.store.databases import DatabaseUnderTest

T0 = 1_686_787_200.0  # 2023-06-15T00:00:00Z, inside the shipped 2023 traces
# 2023-03-26T00:00:00Z: Europe's clocks go forward an hour later (start windows are in
# local time, and a kept node table must read the UTC offsets again).
DST_EVE = 1_679_788_800.0
HOUR_S = 3600.0
POLICY = "green"  # shifts, waits for capacity, migrates and caps: every cache is used
# Zones with a shipped trace, and one without (scored on the fallback).
ZONES = ("DE", "US-CAL-CISO", "SG", "FR")


def _series(trace: HourlyTrace, start: float) -> ZoneSeries:
    """Four days of the zone's recorded 2023 hours around `start`."""
    first = trace.hour_index(start) - 24
    hours = slice(first, first + 96)
    return ZoneSeries(
        zone=trace.zone,
        start_s=trace.start_s + first * HOUR_S,
        carbon_g_per_kwh=trace.carbon("lifecycle")[hours],
        price_per_mwh=trace.price_per_mwh[hours],
        currency=trace.currency,
    )


@functools.cache
def _recorded_grid(start: float) -> Mapping[str, ZoneSeries]:
    traces = shipped_traces()
    return {zone: _series(traces[zone], start) for zone in ZONES if zone in traces}


@functools.cache
def _latency() -> ServingLatency:
    return default_latency_estimator()  # one per loop, as SchedulingLoop keeps it


def green_inputs(now: float) -> GreenInputs:
    start = DST_EVE if now < T0 else T0
    return GreenInputs(
        signals=GridSignals(now_s=now, zones=_recorded_grid(start)),
        latency=_latency(),
    )


# ---- comparing what two passes built ---------------------------------------------------


def assert_same(a: object, b: object, path: str = "") -> None:
    """Equal, field by field, with numpy columns compared by value (and dtype), and
    mappings in the same order: the path of the first difference is in the message."""
    where = path or "value"
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{where}: dtype or shape"
        nan = a.dtype.kind in "fc"
        assert np.array_equal(a, b, equal_nan=nan), f"{where}: {a!r} != {b!r}"
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        for item in dataclasses.fields(a):
            assert_same(getattr(a, item.name), getattr(b, item.name), f"{path}.{item.name}")
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping)
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, tuple | list):
        assert isinstance(b, tuple | list)
        assert len(a) == len(b), f"{where}: {len(a)} items != {len(b)}"
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{index}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


class _Forgetful(dict[Any, Any]):
    """A memo that keeps nothing: every question is answered afresh."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


def without_memos(policy: Policy) -> Policy:
    """The policy with its grid terms' window means and its capacity waiter's timelines
    computed afresh each time they are asked for: the reference the memos must match."""
    terms = [term for term in policy.score_terms if isinstance(term, CarbonTerm | PriceTerm)]
    assert terms, "the policy has no grid terms: nothing to switch off"
    for term in terms:
        assert isinstance(term._memo, dict)
        object.__setattr__(term, "_memo", _Forgetful())
    advisor = policy.start_advisor
    assert isinstance(advisor, CapacityWaiter), "the policy no longer waits for capacity"
    advisor._ends.timelines = _Forgetful()
    advisor._ends.promised = _Forgetful()
    return policy


def decide(inputs: PassInputs, max_attempts: int, *, memos: bool) -> PassDecision:
    """What the loop's pass decides (cloud/loop/loop.py `decide`), with a policy, migrator
    and capper built for the pass as the loop builds them."""
    green = green_inputs(inputs.snapshot.now)
    policy = build_policy(POLICY, green)
    migrator = build_migrator(POLICY, green)
    running = running_jobs(inputs, max_attempts) if migrator else []
    return schedule_then_move(
        inputs.snapshot,
        policy if memos else without_memos(policy),
        migrator,
        running,
        capper=build_power_capper(POLICY, green),
    )


# ---- histories -------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Submit:
    tenant: int
    kind: str  # "training" | "inference"
    priority: PriorityClass
    size: int  # workers or replicas
    accelerators: int  # per worker or replica
    duration_s: float
    preemptible: bool
    checkpointing: bool
    max_delay_s: float | None  # flexible: it may wait for a cleaner window
    window: str | None  # a start window, in the site's local time
    depends_on: int | None  # an earlier job (by pick) it waits to succeed


@dataclass(frozen=True)
class Cancel:
    pick: int


@dataclass(frozen=True)
class RunPass:
    """The plan of the incremental pass, committed as the loop commits it."""


@dataclass(frozen=True)
class Evict:
    pick: int
    retry_after_s: float | None  # a failure its retry policy runs again after a backoff


@dataclass(frozen=True)
class Rescale:
    """A deployment's spec replaced in place (the API's update, autoscaling)."""

    pick: int
    replicas: int


@dataclass(frozen=True)
class Start:
    pick: int


@dataclass(frozen=True)
class Finish:
    pick: int
    succeeded: bool


@dataclass(frozen=True)
class ChangeNode:
    pick: int
    what: str  # "state" | "telemetry" | "labels" | "cordon"
    value: int


@dataclass(frozen=True)
class Join:
    gpus: int
    zone: str


@dataclass(frozen=True)
class Leave:
    pick: int


@dataclass(frozen=True)
class SetQuota:
    tenant: int
    gpus: int | None  # None: no quota (unmanaged)
    max_running: int | None


@dataclass(frozen=True)
class Hold:
    """Hold a pending item, or release it if held (cloud/store/job_control.py)."""

    pick: int


@dataclass(frozen=True)
class Tick:
    seconds: float


Step = (
    Submit
    | Cancel
    | RunPass
    | Evict
    | Rescale
    | Start
    | Finish
    | ChangeNode
    | Join
    | Leave
    | SetQuota
    | Hold
    | Tick
)

TENANTS = 3
PICKS = st.integers(min_value=0, max_value=63)
SUBMITS = st.builds(
    Submit,
    tenant=st.integers(0, TENANTS - 1),
    kind=st.sampled_from(["training", "training", "inference"]),
    priority=st.sampled_from(["p0", "p1", "p2"]),
    size=st.sampled_from([1, 1, 1, 2, 3]),
    accelerators=st.sampled_from([1, 1, 2, 4]),
    duration_s=st.sampled_from([600.0, 3600.0, 4 * HOUR_S, 20 * HOUR_S]),
    preemptible=st.booleans(),
    checkpointing=st.booleans(),
    max_delay_s=st.sampled_from([None, None, 6 * HOUR_S, 24 * HOUR_S]),
    window=st.sampled_from([None] * 6 + ["20:00-06:00", "09:00-17:00"]),
    depends_on=st.none() | PICKS,
)


def _job(*, accelerators: int, duration_s: float, tenant: int = 0) -> Submit:
    """Low-priority, preemptible, checkpointing training of one worker."""
    return Submit(
        tenant=tenant,
        kind="training",
        priority="p2",
        size=1,
        accelerators=accelerators,
        duration_s=duration_s,
        preemptible=True,
        checkpointing=True,
        max_delay_s=None,
        window=None,
        depends_on=None,
    )


# What fills the fleet first: low priority, preemptible, movable, for later submissions
# to preempt and for migration to move.
BACKGROUND = st.builds(
    Submit,
    tenant=st.integers(0, TENANTS - 1),
    kind=st.sampled_from(["training", "training", "inference"]),
    priority=st.just("p2"),
    size=st.sampled_from([1, 1, 2]),
    accelerators=st.sampled_from([1, 2]),
    duration_s=st.sampled_from([1800.0, 4 * HOUR_S, 20 * HOUR_S]),
    preemptible=st.just(True),
    checkpointing=st.just(True),
    max_delay_s=st.just(None),
    window=st.just(None),
    depends_on=st.none(),
)
# Each kind of step, and how often it comes: submissions and passes most, so that
# histories fill the fleet and passes preempt, defer, wait, reserve and move.
STEP_KINDS: Mapping[str, tuple[int, st.SearchStrategy[Step]]] = {
    "submit": (5, SUBMITS),
    "pass": (4, st.just(RunPass())),
    "start": (2, st.builds(Start, pick=PICKS)),
    "cancel": (1, st.builds(Cancel, pick=PICKS)),
    "hold": (1, st.builds(Hold, pick=PICKS)),
    "evict": (
        1,
        st.builds(Evict, pick=PICKS, retry_after_s=st.none() | st.sampled_from([30.0, 600.0])),
    ),
    "finish": (1, st.builds(Finish, pick=PICKS, succeeded=st.booleans())),
    "rescale": (1, st.builds(Rescale, pick=PICKS, replicas=st.integers(1, 4))),
    "node": (
        2,
        st.builds(
            ChangeNode,
            pick=PICKS,
            what=st.sampled_from(["state", "telemetry", "labels", "cordon"]),
            value=st.integers(0, 3),
        ),
    ),
    "join": (
        1,
        st.builds(Join, gpus=st.integers(0, 8), zone=st.sampled_from(ZONES))
        # A clean zone's node: what migration moves to.
        | st.builds(Join, gpus=st.integers(1, 4), zone=st.just("US-CAL-CISO")),
    ),
    "leave": (1, st.builds(Leave, pick=PICKS)),
    "quota": (
        1,
        st.builds(
            SetQuota,
            tenant=st.integers(0, TENANTS - 1),
            gpus=st.none() | st.integers(0, 8),
            max_running=st.none() | st.integers(1, 4),
        ),
    ),
    "tick": (1, st.builds(Tick, seconds=st.sampled_from([1.0, 60.0, 900.0, 4 * HOUR_S]))),
}
STEPS: st.SearchStrategy[Step] = st.sampled_from(
    [kind for kind, (weight, _) in STEP_KINDS.items() for _ in range(weight)]
).flatmap(lambda kind: STEP_KINDS[kind][1])
FLEETS = st.lists(st.tuples(st.integers(1, 4), st.sampled_from(ZONES)), min_size=2, max_size=4)


def _pick(items: list[str], pick: int) -> str | None:
    return items[pick % len(items)] if items else None


def _spec(step: Submit, name: str, dependency: str | None) -> bytes:
    document: dict[str, Any]
    if step.kind == "training":
        document = {
            "name": name,
            "command": ["python", "train.py"],
            "priority": step.priority,
            "workers": step.size,
            "accelerators_per_worker": step.accelerators,
            "estimated_duration_s": step.duration_s,
            "preemptible": step.preemptible,
        }
        if step.checkpointing:
            document["checkpoint_interval_s"] = 300.0
        if step.max_delay_s is not None:
            document["max_delay_s"] = step.max_delay_s
        if step.window is not None:
            document["start_window"] = step.window
        if dependency is not None:
            document["depends_on"] = [{"job": dependency, "condition": "succeeded"}]
    else:
        document = {
            "kind": "deployment",
            "name": name,
            "model_id": "m1",
            "priority": step.priority,
            "replicas": step.size,
            "accelerators_per_replica": min(step.accelerators, 2),
            "sites": ["cloud"],
            "max_replicas_per_node": 2,
        }
    return msgspec.json.encode(document)


@dataclass
class History:
    """One random history on a store: the registry's nodes, and what an incremental
    pass carries from one pass to the next (as SchedulingLoop keeps it)."""

    store: Store
    lease: LeadershipLease
    clock: Clock
    tenants: list[TenantRecord]
    nodes: dict[str, NodeRecord]
    node_ids: itertools.count[int] = field(default_factory=itertools.count)
    cache: ConversionCache = field(default_factory=ConversionCache)
    views: NodeViews = field(default_factory=NodeViews)
    previous: StoreSnapshot | None = None
    last_read: StoreSnapshot | None = None  # for picking work
    passes: int = 0

    def add_node(self, gpus: int, zone: str) -> None:
        node_id = f"n{next(self.node_ids)}"
        self.nodes[node_id] = node(node_id, gpus=gpus, zone=zone)

    @property
    def latest(self) -> StoreSnapshot:
        assert self.last_read is not None, "check() reads the store first"
        return self.last_read

    def active(self, *states: str) -> list[str]:
        return [r.work_id for r in self.latest.work if r.state in states]

    async def check(self) -> tuple[PassInputs, PassDecision]:
        """Build the pass twice, incrementally and from scratch; both must agree."""
        now = self.clock()
        incremental_store = await self.store.load_snapshot(self.previous)
        full_store = await self.store.load_snapshot(None)
        assert_same(incremental_store, full_store, "store")
        records = list(self.nodes.values())
        incremental = build_inputs(
            now, records, incremental_store, self.cache, node_views=self.views
        )
        full = build_inputs(now, records, full_store, ConversionCache(), node_views=NodeViews())
        assert_same(incremental, full, "inputs")
        max_attempts = self.store.max_attempts
        decision = decide(incremental, max_attempts, memos=True)
        assert_same(decision, decide(full, max_attempts, memos=False), "decision")
        self.previous = self.last_read = incremental_store
        self.passes += 1
        return incremental, decision

    async def apply(self, step: Step) -> None:
        store, now = self.store, self.clock()
        self.clock.now += 1.0  # every step takes a moment: submissions keep their order
        if isinstance(step, Submit):
            tenant = self.tenants[step.tenant]
            # A job waits for its own tenant's training only.
            jobs = [
                r.work_id
                for r in self.latest.work
                if r.tenant_id == tenant.tenant_id and r.kind == "training"
            ]
            dependency = (
                _pick(jobs, step.depends_on)
                if step.depends_on is not None and step.kind == "training"
                else None
            )
            await store.submit_work(
                tenant.tenant_id,
                kind="training" if step.kind == "training" else "inference",
                spec=_spec(step, f"w{self.passes}", dependency),
                priority=step.priority,
                dependencies=(NewDependency(dependency, "succeeded"),) if dependency else (),
            )
        elif isinstance(step, Cancel):
            target = _pick(self.active("pending", "scheduled", "running"), step.pick)
            record = self._record(target)
            if record is not None:
                await store.cancel_work(record.tenant_id, record.work_id)
        elif isinstance(step, Hold):
            record = self._record(_pick(self.active("pending"), step.pick))
            if record is not None:
                hold: HoldKind | None = None if record.hold is not None else "held"
                await store.set_hold(record.tenant_id, record.work_id, hold, reason="by hand")
        elif isinstance(step, RunPass):
            inputs, decision = await self.check()
            write = translate(decision.plan, inputs, {}, decision.moves).write
            await store.commit_pass(write, lease=self.lease)
        elif isinstance(step, Evict):
            target = _pick(self.active("scheduled", "running"), step.pick)
            if target is not None:
                retry = None if step.retry_after_s is None else now + step.retry_after_s
                reason = "node lost" if retry is None else "exit code 1"
                eviction = EvictionWrite(work_id=target, reason=reason, retry_not_before=retry)
                await store.commit_pass(PassWrite(evictions=(eviction,)), lease=self.lease)
        elif isinstance(step, Rescale):
            deployments = [r.work_id for r in self.latest.work if r.kind == "inference"]
            record = self._record(_pick(deployments, step.pick))
            if record is not None:
                document = msgspec.json.decode(record.spec)
                document["replicas"] = step.replicas
                spec = msgspec.json.encode(document)
                await store.update_spec(record.tenant_id, record.work_id, spec)
        elif isinstance(step, Start):
            target = _pick(self.active("scheduled"), step.pick)
            if target is not None:
                await store.transition(target, "running")
        elif isinstance(step, Finish):
            record = self._record(_pick(self.active("running"), step.pick))
            if record is not None and record.kind == "training":
                await store.transition(record.work_id, "succeeded" if step.succeeded else "failed")
        elif isinstance(step, ChangeNode):
            self._change_node(step)
        elif isinstance(step, Join):
            self.add_node(step.gpus, step.zone)
        elif isinstance(step, Leave):
            # A node holding work leaves through the loss path (the loop requeues what it
            # held); the registry lacking a node with work is the test further down.
            holding = {a.node_id for a in self.latest.allocations}
            gone = _pick(sorted(set(self.nodes) - holding), step.pick)
            if gone is not None:
                del self.nodes[gone]
        elif isinstance(step, SetQuota):
            tenant = self.tenants[step.tenant]
            quotas: dict[AcceleratorKind, int] = (
                {} if step.gpus is None else {"gpu": step.gpus, "cpu": 64}
            )
            changes = TenantChanges(quotas=quotas, max_running=step.max_running)
            await store.update_tenant(tenant.tenant_id, changes)
        else:
            self.clock.now += step.seconds

    def _record(self, work_id: str | None) -> WorkRecord | None:
        if work_id is None:
            return None
        return next(r for r in self.latest.work if r.work_id == work_id)

    def _change_node(self, step: ChangeNode) -> None:
        node_id = _pick(sorted(self.nodes), step.pick)
        if node_id is None:
            return
        before = self.nodes[node_id]
        if step.what == "state":
            # A new record (the registry replaces them), online or not.
            after = dataclasses.replace(before, state="offline" if step.value % 2 else "online")
        elif step.what == "telemetry":
            sample = _sample(before, 25.0 * step.value)
            after = dataclasses.replace(before, decoded_telemetry=sample, telemetry_seq=sample.seq)
        elif step.what == "labels":
            status = msgspec.structs.replace(before.status, labels={"tier": f"t{step.value}"})
            after = dataclasses.replace(before, status=status)
        else:
            admin = NodeAdminRecord(node_id, cordoned=bool(step.value % 2))
            after = dataclasses.replace(before, admin=admin)
        self.nodes[node_id] = after


def _sample(record: NodeRecord, utilisation_pct: float) -> Telemetry:
    seq = record.telemetry.seq + 1 if record.telemetry is not None else 0
    return Telemetry(
        node_id=record.node_id,
        instance_id="i1",
        seq=seq,
        sampled_at=float(seq),
        interval_s=1.0,
        cpu_utilization_pct=10.0,
        memory_used_bytes=1,
        memory_total_bytes=2,
        accelerators=tuple(
            AcceleratorSample(id=a.id, utilization_pct=utilisation_pct, memory_used_bytes=0)
            for a in record.status.accelerators
            if a.kind == "gpu"
        ),
    )


@pytest.fixture
async def store(database: DatabaseUnderTest) -> AsyncIterator[tuple[Store, Clock]]:
    clock = Clock(T0)
    opened = await open_store(database.settings, clock=clock)
    try:
        yield opened, clock
    finally:
        await opened.close()


async def _end_everything(store: Store, lease: LeadershipLease) -> None:
    """Cancel what a history left running or queued: the next one starts on an empty
    queue (the store is the test's, shared by its examples)."""
    cancellations = tuple(
        StateWrite(work_id=record.work_id, to_state="cancelled")
        for record in (await store.load_snapshot()).work
    )
    await store.commit_pass(PassWrite(state_changes=cancellations), lease=lease)


@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# Clean capacity that frees within the patience of a job queued beside dirty capacity
# free now: it waits (capacity waiting, cloud/green/waiting.py), as random histories
# with the recorded grid seldom make it.
@example(
    fleet=[(2, "US-CAL-CISO"), (4, "SG")],
    background=[_job(accelerators=2, duration_s=1800.0)],
    steps=[
        _job(accelerators=2, duration_s=4 * HOUR_S),
        _job(accelerators=1, duration_s=4 * HOUR_S, tenant=1),
        RunPass(),
        Tick(600.0),
        RunPass(),
        Tick(900.0),
        RunPass(),
    ],
    quotas=False,
    start=T0,
)
# Clean capacity freeing beside a job running on dirty capacity: it moves (migration).
@example(
    fleet=[(2, "US-CAL-CISO"), (2, "SG")],
    background=[
        _job(accelerators=2, duration_s=1800.0),
        _job(accelerators=2, duration_s=4 * HOUR_S),
    ],
    steps=[Finish(pick=0, succeeded=True), RunPass(), Tick(HOUR_S), RunPass()],
    quotas=False,
    start=T0,
)
# Clocks going forward between two passes, jobs waiting for their start window.
@example(
    fleet=[(2, "DE"), (2, "FR")],
    background=[_job(accelerators=1, duration_s=20 * HOUR_S)],
    steps=[
        dataclasses.replace(_job(accelerators=1, duration_s=HOUR_S), window="03:00-05:00"),
        RunPass(),
        Tick(HOUR_S),
        RunPass(),
        Tick(HOUR_S),
        RunPass(),
    ],
    quotas=False,
    start=DST_EVE,
)
@given(
    fleet=FLEETS,
    background=st.lists(BACKGROUND, min_size=1, max_size=6),
    steps=st.lists(STEPS, min_size=10, max_size=20),
    quotas=st.booleans(),
    start=st.sampled_from([T0, DST_EVE]),
)
async def test_incremental_passes_build_the_inputs_and_plans_of_full_passes(
    store: tuple[Store, Clock],
    fleet: list[tuple[int, str]],
    background: list[Submit],
    steps: list[Step],
    quotas: bool,
    start: float,
) -> None:
    opened, clock = store
    clock.now = start
    tenants: list[TenantRecord] = []
    for _ in range(TENANTS):
        name = f"t{len(await opened.list_tenants())}"
        tenant_quotas: dict[AcceleratorKind, int] = (
            {"gpu": 4, "cpu": 64} if quotas and not tenants else {}
        )
        created = await opened.create_tenant(NewTenant(name=name, quotas=tenant_quotas))
        tenants.append(created.tenant)
    lease = await opened.try_acquire_leadership()
    assert lease is not None
    history = History(opened, lease, clock, tenants, {})
    for gpus, zone in fleet:
        history.add_node(gpus, zone)
    try:
        await history.check()
        # The background placed and running, a quarter of an hour on (past migration's
        # cooldown, short runs ending within capacity waiting's patience); then the
        # random steps.
        started: list[Step] = [Start(pick) for pick in range(len(background))]
        for step in [*background, RunPass(), *started, Tick(900.0), *steps]:
            await history.apply(step)
            await history.check()
    finally:
        await _end_everything(opened, lease)
        await lease.release()


# ---- bounded passes --------------------------------------------------------------------


def _queued_record(index: int, step: Submit) -> WorkRecord:
    kind = "training" if step.kind == "training" else "inference"
    return dataclasses.replace(
        work(f"q{index:02d}", kind=kind, state="pending", attempts=0, version=1),
        spec=_spec(step, f"q{index}", None),
        tenant_id=f"t{step.tenant}",
        priority=step.priority,
        submitted_at=T0 - 60.0 * (20 - index),
    )


def _running(slots: list[tuple[int, int]], nodes: list[NodeRecord]) -> StoreSnapshot:
    """Low-priority preemptible jobs of one GPU each, on the given (node, device) slots."""
    records, allocations = [], []
    for index, (node_index, device) in enumerate(sorted(set(slots))):
        record = nodes[node_index % len(nodes)]
        gpus = [a.id for a in record.status.accelerators if a.kind == "gpu"]
        if device >= len(gpus):
            continue
        work_id = f"r{index:02d}"
        records.append(
            dataclasses.replace(
                work(work_id, state="running", estimated_duration_s=4 * HOUR_S),
                priority="p2",
                tenant_id=f"t{index % TENANTS}",
            )
        )
        allocations.append(
            dataclasses.replace(
                allocation(work_id, 0, record.node_id, (gpus[device],)),
                priority="p2",
                started_at=T0 - HOUR_S,
                expected_end=T0 + 3 * HOUR_S,
            )
        )
    return StoreSnapshot(
        tenants=(), work=tuple(records), allocations=tuple(allocations), node_generations={}
    )


@settings(max_examples=50, deadline=None, derandomize=True)
@given(
    fleet=FLEETS,
    queued=st.lists(SUBMITS, min_size=1, max_size=16),
    running=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=8),
    depth=st.integers(min_value=1, max_value=8),
    policy_name=st.sampled_from(["green", "fifo-binpack", "balanced"]),
)
def test_a_bounded_pass_decides_the_head_of_the_queue_as_the_full_pass_does(
    fleet: list[tuple[int, str]],
    queued: list[Submit],
    running: list[tuple[int, int]],
    depth: int,
    policy_name: str,
) -> None:
    """docs/scheduling.md "Bounded passes": a pass bounded to `depth` decisions decides
    the head of the queue in its order; each decision is the one the whole pass makes
    (the core decides one item after the other, nothing later changes an earlier one),
    and the rest is left undecided."""
    nodes = [node(f"n{i}", gpus=gpus, zone=zone) for i, (gpus, zone) in enumerate(fleet)]
    placed = _running(running, nodes)
    store = dataclasses.replace(
        placed, work=(*placed.work, *(_queued_record(i, s) for i, s in enumerate(queued)))
    )
    snapshot = build_inputs(T0, nodes, store).snapshot
    green = green_inputs(T0)
    full = schedule(snapshot, build_policy(policy_name, green))
    bounded = schedule(snapshot, build_policy(policy_name, green), max_decisions=depth)

    head = full.order[:depth]
    decided = set(head)
    assert sorted(full.order) == sorted(w.work_id for w in snapshot.queue)
    assert bounded.order == head
    assert bounded.undecided == {w.work_id for w in snapshot.queue} - decided
    assert_same(bounded.placements, tuple(p for p in full.placements if p.work_id in decided))
    assert_same(
        bounded.preemptions, tuple(p for p in full.preemptions if p.preempted_by in decided)
    )
    assert_same(bounded.pending, tuple(p for p in full.pending if p.work_id in decided))
    assert_same(bounded.reservations, tuple(r for r in full.reservations if r.work_id in decided))


# ---- found by the histories ------------------------------------------------------------


def test_a_top_up_beside_a_replica_on_a_node_the_registry_lacks_repeats_no_member() -> None:
    """A deployment short of a replica (one lost, preempted, or its count raised) with
    another replica on a node the registry does not know (after a restart, until its
    birth or its loss): the scheduler does not see that replica (build_inputs leaves it
    out) and numbers the new one as it, so the pass's placement repeated a member index
    and every pass failed until the node came back or was declared lost."""
    deployment = work("dep", kind="inference", state="running", replicas=3, sites=["cloud"])
    store = StoreSnapshot(
        tenants=(),
        work=(deployment,),
        allocations=(
            allocation("dep", 0, "n1", ("gpu0",), kind="inference"),
            allocation("dep", 1, "unknown", ("gpu0",), kind="inference"),
        ),
        node_generations={},
    )
    inputs = build_inputs(T0, [node("n1"), node("n2")], store)
    plan = schedule(inputs.snapshot)
    (placed,) = plan.placements
    assert placed.node_id == "n2"
    (write,) = translate(plan, inputs, {}).write.placements
    members = sorted((a.member_index, a.node_id) for a in write.allocations)
    assert [node_id for _, node_id in members] == ["n1", "unknown", "n2"]
    assert len({index for index, _ in members}) == 3
