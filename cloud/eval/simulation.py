"""Discrete-event simulation that drives the real scheduler core in simulated time.

Events: job submissions, training completions, deployment retirements and an
hourly tick. After the events of one instant, one scheduling pass runs:
``cloud.scheduler.schedule`` on a snapshot of the simulated cluster, with the
policy built (once per hour) from the grid signals the trace provider gives at
that time — recorded history and a *forecast* of the future, never the future
itself. Deferred and windowed jobs get a pass at their retry time too, so every
decision is revisited at least hourly as forecasts change.

Placements start at once; a training gang runs for its expected run time on its
slowest node (``duration_s / relative_speed`` of the pool it holds there, a MIG slice's
own where it holds slices; longer where the policy caps its GPUs' power, never a
slice's, as live: ``cloud.green.power_capping``); preempted work stops and is
queued again with its original submission time. A job that saves checkpoints
keeps its progress up to the newest one and resumes with what is left (plus
``restart_s``); under a policy that migrates, the policy's ``Migrator`` looks
after every pass that preempted nothing for running jobs to move to cleaner
capacity, which stop and resume at once on their new nodes. A pass is the live
loop's: ``cloud.green.pass_rule.schedule_then_move``. Submissions stop after the
evaluated period (work submitted later is never submitted); the run then drains
(passes continue) until every training job has finished, so every policy does the
same work, or until ``max_drain_s`` after the period, when what still runs stops
(the runner refuses a job that could not finish by then, and the optimum's shares
are withheld where one did not: bound.py). Inference is counted within the
evaluated period only.

Measured per run: usage records, each naming the pool it held (accounted by
``cloud.green.accounting`` at that pool's power, against the *recorded* signals),
queue waits, deadline misses, SLO violations per deployment-hour, deferrals and, per
job, the ``fifo-binpack`` counterfactual at submission.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from cloud.green.accounting import Counterfactual, Usage, counterfactual
from cloud.green.energy import EnergyModel
from cloud.green.latency import ServingLatency
from cloud.green.migration import Migrator, RunningJob
from cloud.green.pass_rule import schedule_then_move
from cloud.green.policies import (
    GreenInputs,
    PolicySpec,
    build_migrator,
    build_policy,
    build_power_capper,
    policy_spec,
)
from cloud.green.power_capping import PowerCapper
from cloud.green.room import RoomMaker
from cloud.green.waiting import DEFAULT_PATIENCE_S
from cloud.loop.autoscale import Autoscaler, ServingLoad
from cloud.scheduler import (
    AcceleratorPool,
    Allocation,
    InferenceDeployment,
    Node,
    Placement,
    Plan,
    Policy,
    Snapshot,
    TrainingJob,
    Work,
)
from cloud.signals.forecast import DEFAULT_FORECASTER
from cloud.signals.grid import GridSignals
from cloud.signals.trace import TraceProvider
from shared.accelerators import capped_speed

from .workload import (
    InferenceSpec,
    TrainingSpec,
    Workload,
    deployment,
    requests_per_s,
    traffic_weights,
    training_job,
    within_period,
)

HOUR_S = 3600.0
DAY_S = 24 * HOUR_S

# Order of events at the same instant: work that ends frees capacity first.
_FINISH, _RETIRE, _SUBMIT, _WAKE = 0, 1, 2, 3
EventKind = Literal[0, 1, 2, 3]
# One pool of one node: (node id, accelerator kind, pool model).
_PoolKey = tuple[str, str, str]


class HookFailedInEvaluation(RuntimeError):
    """A policy's hook failed during a simulated pass: the evaluation stops, naming it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    start_s: float
    days: float
    policy: PolicySpec
    energy: EnergyModel = field(default_factory=EnergyModel)
    history_hours: int = 24
    horizon_hours: int = 48
    forecaster: str = DEFAULT_FORECASTER
    min_saving: float | None = None  # temporal shifting's; None: the policy's default
    safety_margin_s: float = 3600.0
    migration: bool = True  # policies that migrate may (False: an ablation)
    migration_min_saving: float = 0.2
    restart_s: float = 300.0  # reference seconds to resume from a checkpoint
    patience_s: float = DEFAULT_PATIENCE_S  # waiting for cleaner capacity (waiting.py)
    power_capping: bool = True  # policies that cap GPU power may (False: an ablation)
    # Policies that migrate also move small jobs to make room for a waiting worker
    # (cloud/green/room.py; False: an ablation).
    room_making: bool = True
    max_drain_s: float = 14 * DAY_S  # give up draining after this (a stuck job)
    counterfactuals: bool = True

    @property
    def end_s(self) -> float:
        return self.start_s + self.days * DAY_S


@dataclass(slots=True)
class JobRecord:
    spec: TrainingSpec
    submitted_s: float
    deadline_s: float | None
    latest_start_s: float | None  # from max_delay_s
    first_start_s: float | None = None
    finish_s: float | None = None
    deferred: bool = False  # deferred by a start advisor (either cause) at least once
    # The same split by cause (Deferral.cause): held for a cleaner window in its slack,
    # held for cleaner capacity that frees soon, or pending because nothing had room.
    deferred_temporal: bool = False
    deferred_capacity: bool = False
    waited_for_room: bool = False
    capped: bool = False  # started at least once with its devices' power held down
    reshaped: bool = False  # started at least once in an alternative shape (flexible shapes)
    deferred_s: float = 0.0  # time spent held back by temporal shifting
    deferred_since: float | None = None
    nodes: tuple[str, ...] = ()
    counterfactual: Counterfactual | None = None
    left_s: float = 0.0  # reference seconds of work left when the current run started
    run: RunningJob | None = None  # the current run
    migrations: int = 0
    preemptions: dict[str, int] = field(default_factory=dict)  # by reason, once per stop

    @property
    def missed(self) -> bool:
        if self.deadline_s is not None and (
            self.finish_s is None or self.finish_s > self.deadline_s + 1e-6
        ):
            return True
        return self.latest_start_s is not None and (
            self.first_start_s is None or self.first_start_s > self.latest_start_s + 1e-6
        )


@dataclass(slots=True)
class ReplicaRun:
    spec: InferenceSpec
    node_id: str
    accelerator_kind: str
    accelerators: int
    start_s: float
    end_s: float | None = None
    accelerator_model: str = ""  # its pool's (``Allocation.accelerator_model``)


@dataclass(slots=True)
class DeploymentRecord:
    spec: InferenceSpec
    submitted_s: float
    retire_s: float | None
    counterfactual: Counterfactual | None = None
    retired: bool = False
    desired: int = 0  # replicas wanted now: the spec's, or its autoscaler's


@dataclass(slots=True)
class SimOutcome:
    config: SimConfig
    nodes: tuple[Node, ...]
    usages: list[Usage]
    jobs: dict[str, JobRecord]
    deployments: dict[str, DeploymentRecord]
    replicas: list[ReplicaRun]
    slo_violations: int
    slo_hours: int
    passes: int
    stopped_s: float


class Simulation:
    def __init__(
        self,
        config: SimConfig,
        nodes: Sequence[Node],
        workload: Workload,
        provider: TraceProvider,
        latency: ServingLatency,
    ) -> None:
        self.config = config
        self._base_nodes = {node.node_id: node for node in nodes}
        self._zones = sorted({node.zone for node in nodes})
        self._workload = workload
        self._tenants = tuple(spec.to_tenant() for spec in workload.tenants)
        self._provider = provider
        self._latency = latency
        self._events: list[tuple[float, int, int, str]] = []
        self._sequence = 0
        self.now = config.start_s
        self.running: dict[str, Allocation] = {}
        self._busy: dict[_PoolKey, int] = {}  # accelerators in use per pool
        self._node_view: dict[str, Node] = dict(self._base_nodes)
        self.queue: dict[str, Work] = {}
        self._training_specs = {spec.id: spec for spec in workload.training}
        self._inference_specs = {spec.id: spec for spec in workload.inference}
        self.jobs: dict[str, JobRecord] = {}
        self.deployments: dict[str, DeploymentRecord] = {}
        self._generation: dict[str, int] = {}
        self._ends: dict[str, float] = {}
        self._replicas: dict[str, ReplicaRun] = {}  # allocation id -> run (running)
        self.replica_runs: list[ReplicaRun] = []
        self.usages: list[Usage] = []
        self._policy_hour: int | None = None
        self._policy: Policy | None = None
        self._migrator: Migrator | None = None
        self._capper: PowerCapper | None = None
        self._baseline: Policy | None = None
        self._wakes: set[float] = set()
        self._autoscaler = Autoscaler()
        self.slo_violations = 0
        self.slo_hours = 0
        self.passes = 0
        self._outstanding_training = 0

    # -- events -------------------------------------------------------------------

    def _push(self, at_s: float, kind: int, key: str = "") -> None:
        self._sequence += 1
        heapq.heappush(self._events, (at_s, kind, self._sequence, key))

    def _wake(self, at_s: float) -> None:
        if at_s > self.now and at_s not in self._wakes:
            self._wakes.add(at_s)
            self._push(at_s, _WAKE)

    def run(self) -> SimOutcome:
        config = self.config
        start, end = config.start_s, config.end_s
        submitted = within_period(self._workload, config.days * DAY_S)
        for spec in submitted.training:
            self._push(start + spec.submit_offset_s, _SUBMIT, "t:" + spec.id)
            self._outstanding_training += 1
        for inference in submitted.inference:
            self._push(start + inference.start_offset_s, _SUBMIT, "i:" + inference.id)
        hour = math.floor(start / HOUR_S) * HOUR_S + HOUR_S
        self._push(start, _WAKE)
        self._wakes.add(start)
        while hour <= end:
            self._push(hour, _WAKE)
            self._wakes.add(hour)
            hour += HOUR_S
        give_up = end + config.max_drain_s
        while self._events:
            at = self._events[0][0]
            if at >= end and self._outstanding_training == 0:
                break
            if at > give_up:
                break
            self.now = at
            self._wakes.discard(at)
            while self._events and self._events[0][0] == at:
                _, kind, _, key = heapq.heappop(self._events)
                self._handle(kind, key)
            if at % HOUR_S == 0:
                self._autoscale(at)
            self._pass()
            if start <= at < end and at % HOUR_S == 0:
                self._check_slos(at)
            if at >= end - HOUR_S and self._outstanding_training:
                # Draining: keep revisiting hourly while training remains.
                self._wake(math.floor(at / HOUR_S) * HOUR_S + HOUR_S)
        stop = max(self.now, end)
        self._close(stop)
        return SimOutcome(
            config=config,
            nodes=tuple(self._base_nodes.values()),
            usages=self.usages,
            jobs=self.jobs,
            deployments=self.deployments,
            replicas=self.replica_runs,
            slo_violations=self.slo_violations,
            slo_hours=self.slo_hours,
            passes=self.passes,
            stopped_s=stop,
        )

    def _handle(self, kind: int, key: str) -> None:
        if kind == _FINISH:
            work_id, _, generation = key.rpartition("#")
            if self._generation.get(work_id) == int(generation):
                self._finish(work_id)
        elif kind == _SUBMIT:
            if key.startswith("t:"):
                self._submit_training(self._training_specs[key[2:]])
            else:
                self._submit_inference(self._inference_specs[key[2:]])
        elif kind == _RETIRE:
            self._retire(key)

    # -- work coming and going -------------------------------------------------------

    def _submit_training(self, spec: TrainingSpec) -> None:
        job = training_job(spec, self.now)
        self.jobs[spec.id] = JobRecord(
            spec=spec,
            submitted_s=self.now,
            deadline_s=job.deadline,
            latest_start_s=(self.now + spec.max_delay_s if spec.max_delay_s is not None else None),
            left_s=spec.duration_s,
        )
        if self.config.counterfactuals:
            self.jobs[spec.id].counterfactual = counterfactual(
                self._snapshot(list(self.queue.values())), job, self._baseline_policy()
            )
        self.queue[spec.id] = job

    def _submit_inference(self, spec: InferenceSpec) -> None:
        work = deployment(spec, self.now)
        retire = self.now + spec.lifetime_s if spec.lifetime_s is not None else None
        record = DeploymentRecord(
            spec=spec, submitted_s=self.now, retire_s=retire, desired=spec.replicas
        )
        if self.config.counterfactuals:
            record.counterfactual = counterfactual(
                self._snapshot(list(self.queue.values())), work, self._baseline_policy()
            )
        self.deployments[spec.id] = record
        self.queue[spec.id] = work
        if retire is not None:
            self._push(retire, _RETIRE, spec.id)

    def _retire(self, work_id: str) -> None:
        self.deployments[work_id].retired = True
        self.queue.pop(work_id, None)
        for alloc in [a for a in self.running.values() if a.work_id == work_id]:
            self._release(alloc)

    def _finish(self, work_id: str) -> None:
        for alloc in [a for a in self.running.values() if a.work_id == work_id]:
            self._release(alloc)
        self._ends.pop(work_id, None)
        record = self.jobs[work_id]
        record.finish_s = self.now
        record.run = None
        record.left_s = 0.0
        self._outstanding_training -= 1

    def _pool_key(self, alloc: Allocation) -> _PoolKey:
        """The pool ``alloc`` holds, as ``_busy`` counts it."""
        node = self._base_nodes[alloc.node_id]
        pool = pool_of(node, alloc.accelerator_kind, alloc.accelerator_model)
        return (alloc.node_id, pool.kind, pool.model)

    def _hold(self, alloc: Allocation) -> None:
        self.running[alloc.allocation_id] = alloc
        key = self._pool_key(alloc)
        self._busy[key] = self._busy.get(key, 0) + alloc.accelerators
        self._refresh_node(alloc.node_id)

    def _release(self, alloc: Allocation) -> None:
        del self.running[alloc.allocation_id]
        key = self._pool_key(alloc)
        self._busy[key] -= alloc.accelerators
        self._refresh_node(alloc.node_id)
        if alloc.work_kind == "training":
            self.usages.append(
                Usage(
                    allocation_id=f"{alloc.allocation_id}@{alloc.started_at:.0f}",
                    work_id=alloc.work_id,
                    tenant=alloc.tenant,
                    node_id=alloc.node_id,
                    accelerator_kind=alloc.accelerator_kind,
                    accelerators=alloc.accelerators,
                    start_s=alloc.started_at,
                    end_s=self.now,
                    utilisation=self.config.energy.training_utilisation,
                    power_limit_w=alloc.power_limit_w,
                    accelerator_model=alloc.accelerator_model,
                )
            )
        else:
            run = self._replicas.pop(alloc.allocation_id)
            run.end_s = self.now

    def _refresh_node(self, node_id: str) -> None:
        self._node_view[node_id] = self._view_of(node_id, self._busy)

    def _view_of(self, node_id: str, busy: dict[_PoolKey, int]) -> Node:
        """Pool utilisation as telemetry would report it: the busy share of the pool
        at the utilisation work drives it to (a node's slices and whole GPUs apart)."""
        base = self._base_nodes[node_id]
        drive = self.config.energy.training_utilisation
        pools = tuple(
            dataclasses.replace(
                pool,
                utilisation=min(
                    1.0, busy.get((node_id, pool.kind, pool.model), 0) / pool.count * drive
                ),
            )
            if pool.count
            else pool
            for pool in base.pools
        )
        return dataclasses.replace(base, pools=pools)

    # -- scheduling --------------------------------------------------------------------

    def _snapshot(self, queue: Sequence[Work]) -> Snapshot:
        return Snapshot.build(
            now=self.now,
            nodes=list(self._node_view.values()),
            allocations=list(self.running.values()),
            queue=list(queue),
            tenants=self._tenants,
        )

    def _signals(self) -> GridSignals:
        return self._provider.grid_signals(
            self._zones,
            self.now,
            history_hours=self.config.history_hours,
            horizon_hours=self.config.horizon_hours,
            forecaster=self.config.forecaster,
        )

    def _inputs(self, signals: GridSignals) -> GreenInputs:
        return GreenInputs(
            signals=signals,
            latency=self._latency,
            energy=self.config.energy,
            min_saving=self.config.min_saving,
            safety_margin_s=self.config.safety_margin_s,
            migration=self.config.migration,
            migration_min_saving=self.config.migration_min_saving,
            restart_s=self.config.restart_s,
            patience_s=self.config.patience_s,
            power_capping=self.config.power_capping,
        )

    def _current_policy(self) -> Policy:
        hour = math.floor(self.now / HOUR_S)
        if self._policy is None or self._policy_hour != hour:
            inputs = self._inputs(self._signals())
            self._policy = build_policy(self.config.policy, inputs)
            self._migrator = build_migrator(self.config.policy, inputs)
            self._capper = build_power_capper(self.config.policy, inputs)
            self._policy_hour = hour
        return self._policy

    def _baseline_policy(self) -> Policy:
        if self._baseline is None:
            # fifo-binpack reads no signals: any snapshot of them will do.
            self._baseline = build_policy(
                policy_spec("fifo-binpack"), self._inputs(GridSignals(now_s=self.now))
            )
        return self._baseline

    def _pass(self) -> None:
        """One pass by the live loop's rule: schedule the queue, then, unless that
        preempted anything, move running training the policy's migrator finds a
        cleaner place for."""
        queued = dict(self.queue)
        policy = self._current_policy()
        running = self._movable_runs()
        if not queued and not running:
            return
        decision = schedule_then_move(
            self._snapshot(list(queued.values())),
            policy,
            self._migrator,
            running,
            cluster_after=self._cluster_after,
            capper=self._capper,
            room_maker=(
                RoomMaker(self._migrator)
                if self._migrator is not None and self.config.room_making
                else None
            ),
        )
        failed = next((p for p in decision.plan.pending if p.hook_failure is not None), None)
        if failed is not None:
            # Live, a failing hook leaves one job waiting; in an evaluation it would
            # quietly turn into waits and misses that measure the bug, not the policy.
            raise HookFailedInEvaluation(failed.message)
        if queued:
            self.passes += 1
            self._apply(decision.plan, queued)
        for move in decision.moves:
            record = self.jobs[move.work_id]
            self._stop_run(move.work_id)
            record.migrations += 1
            self._start(move.resumed, list(move.placements))
        if any(move.room_for is not None for move in decision.moves):
            # The room is made; as the live loop's next pass, place the job in it.
            self._wake(self.now + 1.0)

    def _movable_runs(self) -> list[RunningJob]:
        """The current runs that may move, when the policy migrates."""
        if self._migrator is None:
            return []
        return [
            run
            for work_id in self._ends
            if (run := self.jobs[work_id].run) is not None and run.job.movable
        ]

    def _cluster_after(self, snapshot: Snapshot, plan: Plan) -> Snapshot:
        """The cluster once ``plan``'s placements run, as ``_hold`` will leave it:
        simulated telemetry (utilisation) is up to date at once. Changes nothing."""
        if not plan.placements:
            return snapshot  # the queue it carries is not looked at by the migrator
        busy = dict(self._busy)
        views = dict(self._node_view)
        allocations = list(self.running.values())
        for placement in plan.placements:
            allocation = placement.to_allocation()
            allocations.append(allocation)
            key = self._pool_key(allocation)
            busy[key] = busy.get(key, 0) + allocation.accelerators
        for node_id in {placement.node_id for placement in plan.placements}:
            views[node_id] = self._view_of(node_id, busy)
        return Snapshot.build(
            now=self.now,
            nodes=list(views.values()),
            allocations=allocations,
            tenants=self._tenants,
        )

    def _stop_run(self, work_id: str) -> None:
        """Stop a running gang; its progress up to the newest checkpoint is kept."""
        record = self.jobs[work_id]
        if record.run is not None:
            record.left_s -= record.run.saved_s(self.now)
        for alloc in [a for a in self.running.values() if a.work_id == work_id]:
            self._release(alloc)
        self._generation[work_id] = self._generation.get(work_id, 0) + 1
        self._ends.pop(work_id, None)
        record.run = None

    def _resumed(self, record: JobRecord) -> TrainingJob:
        """The job to queue again: all of it, or what is left plus the restart."""
        spec = record.spec
        if record.left_s >= spec.duration_s:
            return training_job(spec, record.submitted_s)
        return training_job(spec, record.submitted_s, record.left_s + self.config.restart_s)

    def _apply(self, plan: Plan, queued: dict[str, Work]) -> None:
        for preemption in plan.preemptions:
            victim = self.running.get(preemption.allocation_id)
            if victim is not None:
                if victim.work_kind == "training":
                    counts = self.jobs[victim.work_id].preemptions
                    counts[preemption.reason] = counts.get(preemption.reason, 0) + 1
                self._preempt(victim)
        by_work: dict[str, list[Placement]] = {}
        for placement in plan.placements:
            by_work.setdefault(placement.work_id, []).append(placement)
        deferred = {p.work_id for p in plan.pending if p.code == "deferred"}
        causes = {
            p.work_id: p.deferral.cause
            for p in plan.pending
            if p.code == "deferred" and p.deferral is not None
        }
        no_room = {p.work_id for p in plan.pending if p.code in ("capacity", "reserved")}
        for work_id in queued:
            record = self.jobs.get(work_id)
            if record is None:
                continue
            if record.deferred_since is not None:
                record.deferred_s += self.now - record.deferred_since
            record.deferred_since = self.now if work_id in deferred else None
            record.deferred = record.deferred or work_id in deferred
            cause = causes.get(work_id)
            record.deferred_temporal = record.deferred_temporal or cause == "temporal"
            record.deferred_capacity = record.deferred_capacity or cause == "capacity"
            record.waited_for_room = record.waited_for_room or work_id in no_room
        for work_id, placements in by_work.items():
            self._start(queued[work_id], placements)
        for pending in plan.pending:
            if pending.retry_at is not None:
                self._wake(pending.retry_at)

    def _start(self, work: Work, placements: list[Placement]) -> None:
        self.queue.pop(work.work_id, None)
        for placement in placements:
            alloc = placement.to_allocation()
            self._hold(alloc)
            if isinstance(work, InferenceDeployment):
                run = ReplicaRun(
                    spec=self._inference_specs[work.work_id],
                    node_id=placement.node_id,
                    accelerator_kind=placement.accelerator_kind,
                    accelerators=placement.accelerators,
                    start_s=self.now,
                    accelerator_model=placement.accelerator_model,
                )
                self._replicas[alloc.allocation_id] = run
                self.replica_runs.append(run)
        if isinstance(work, TrainingJob):
            record = self.jobs[work.work_id]
            if record.first_start_s is None:
                record.first_start_s = self.now
            record.nodes = tuple(sorted({p.node_id for p in placements}))
            record.capped = record.capped or any(p.power_limit_w is not None for p in placements)
            record.reshaped = record.reshaped or placements[0].declared_shape is not None
            record.run = RunningJob(
                job=work,
                started_s=self.now,
                speed=min(self._pace(p) for p in placements),
                restart_s=max(0.0, work.duration_s - record.left_s),
            )
            ends = [p.expected_end for p in placements if p.expected_end is not None]
            end = max(ends)
            generation = self._generation.get(work.work_id, 0) + 1
            self._generation[work.work_id] = generation
            self._ends[work.work_id] = end
            self._push(end, _FINISH, f"{work.work_id}#{generation}")

    def _pace(self, placement: Placement) -> float:
        """The relative speed a placement runs at: its pool's (a MIG slice's own, as the
        scheduler's ``expected_end`` already has it), slower under a power cap."""
        pool = pool_of(
            self._base_nodes[placement.node_id],
            placement.accelerator_kind,
            placement.accelerator_model,
        )
        return capped_speed(pool.relative_speed, placement.power_limit_w, pool.max_power_w)

    def _preempt(self, victim: Allocation) -> None:
        if victim.work_kind == "training":
            self._stop_run(victim.work_id)
            self.queue[victim.work_id] = self._resumed(self.jobs[victim.work_id])
        else:
            self._release(victim)
            spec = self._inference_specs[victim.work_id]
            record_d = self.deployments[victim.work_id]
            queued = self.queue.get(victim.work_id)
            missing = 1 + (queued.replicas if isinstance(queued, InferenceDeployment) else 0)
            self.queue[victim.work_id] = deployment(spec, record_d.submitted_s, missing)

    # -- autoscaling ---------------------------------------------------------------------

    def _autoscale(self, at_s: float) -> None:
        """The live autoscaler's rule (cloud/loop/autoscale.py), once an hour, on the
        highest load of the coming hour: a live autoscaler follows the load within
        seconds, which an hourly step can only stand for by sizing for the hour's peak.
        Growing queues the missing replicas (placed, or preempting, by the next pass);
        shrinking drops queued ones first, then stops the newest running ones."""
        for work_id, record in self.deployments.items():
            spec = record.spec
            if spec.autoscale is None or record.retired:
                continue
            running = [a for a in self.running.values() if a.work_id == work_id]
            rate = max(requests_per_s(spec, at_s), requests_per_s(spec, at_s + HOUR_S))
            load = ServingLoad(len(running), rate, None) if running else None
            decision = self._autoscaler.decide(
                work_id, spec.autoscale, record.desired, load, now_s=at_s
            )
            if decision is not None:
                record.desired = decision.to_replicas
            queued = self.queue.get(work_id)
            waiting = queued.replicas if isinstance(queued, InferenceDeployment) else 0
            missing = record.desired - len(running)
            if missing > 0 and missing != waiting:
                self.queue[work_id] = deployment(spec, record.submitted_s, missing)
            elif missing <= 0:
                self.queue.pop(work_id, None)
                newest = sorted(running, key=lambda a: a.started_at, reverse=True)
                for alloc in newest[:-missing]:  # the surplus
                    self._release(alloc)

    # -- service levels ----------------------------------------------------------------

    def _check_slos(self, at_s: float) -> None:
        """One deployment-hour each: violated when replicas are missing or any running
        replica's latency at this hour's traffic exceeds the SLO."""
        running: dict[str, list[Allocation]] = {}
        for alloc in self.running.values():
            if alloc.work_kind == "inference":
                running.setdefault(alloc.work_id, []).append(alloc)
        for work_id, record in self.deployments.items():
            if record.retired:
                continue
            spec = record.spec
            self.slo_hours += 1
            replicas = running.get(work_id, [])
            if len(replicas) < record.desired:
                self.slo_violations += 1
                continue
            if spec.latency_slo_ms is None:
                continue
            if self._worst_latency_ms(spec, replicas, at_s + HOUR_S / 2) > spec.latency_slo_ms:
                self.slo_violations += 1

    def _worst_latency_ms(
        self, spec: InferenceSpec, replicas: list[Allocation], at_s: float
    ) -> float:
        work = deployment(spec, at_s, len(replicas))
        rate = requests_per_s(spec, at_s)
        mix = traffic_weights(spec, at_s)
        worst = 0.0
        for alloc in replicas:
            node = self._base_nodes[alloc.node_id]
            pool = pool_of(node, alloc.accelerator_kind, alloc.accelerator_model)
            network = float(self._latency.network_ms((node.region,), mix)[0])
            response = float(
                self._latency.response_ms(
                    work,
                    pool.kind,
                    np.array([pool.relative_speed]),
                    requests_per_s=rate,
                )[0]
            )
            worst = max(worst, network + response)
        return worst

    # -- the end -------------------------------------------------------------------------

    def _close(self, stop_s: float) -> None:
        """Stop what still runs (usage up to ``stop_s``) and cut inference into hours."""
        for alloc in list(self.running.values()):
            self.now = stop_s
            self._release(alloc)
        self.usages.extend(self._inference_usages())

    def _inference_usages(self) -> list[Usage]:
        config = self.config
        usages = []
        for number, run in enumerate(self.replica_runs):
            node = self._base_nodes[run.node_id]
            pool = pool_of(node, run.accelerator_kind, run.accelerator_model)
            usages.extend(
                replica_usages(
                    run.spec,
                    f"{run.spec.id}/r{number}",
                    run.node_id,
                    pool,
                    run.accelerators,
                    max(run.start_s, config.start_s),
                    min(run.end_s if run.end_s is not None else config.end_s, config.end_s),
                )
            )
        return usages


def pool_of(node: Node, kind: str, model: str = "") -> AcceleratorPool:
    """``node``'s pool of ``kind`` and ``model``; its first pool of the kind where the
    model is empty or not there (``NodeTable.column_of``'s rule)."""
    pools = [pool for pool in node.pools if pool.kind == kind]
    return next((pool for pool in pools if model and pool.model == model), pools[0])


def serving_replicas(spec: InferenceSpec, rate: float) -> int:
    """Over how many replicas a deployment's requests spread: its count, or, autoscaled
    on a request rate, what its autoscaler keeps for that rate."""
    scale = spec.autoscale
    if scale is None or scale.target_requests_per_s is None:
        return spec.replicas
    wanted = math.ceil(rate / scale.target_requests_per_s)
    return max(scale.min_replicas, min(scale.max_replicas, wanted))


def replica_usages(
    spec: InferenceSpec,
    allocation_id: str,
    node_id: str,
    pool: AcceleratorPool,
    accelerators: int,
    start_s: float,
    end_s: float,
) -> list[Usage]:
    """One replica's use, cut at hour boundaries, each hour at that hour's load."""
    usages = []
    at = start_s
    service_s = spec.reference_ms_per_request / pool.relative_speed / 1000.0
    while at < end_s:
        stop = min(end_s, math.floor(at / HOUR_S) * HOUR_S + HOUR_S)
        rate = requests_per_s(spec, (at + stop) / 2)
        usages.append(
            Usage(
                allocation_id=f"{allocation_id}@{at:.0f}",
                work_id=spec.id,
                tenant=spec.tenant,
                node_id=node_id,
                accelerator_kind=pool.kind,
                accelerators=accelerators,
                start_s=at,
                end_s=stop,
                utilisation=min(1.0, rate / serving_replicas(spec, rate) * service_s),
                accelerator_model=pool.model,
            )
        )
        at = stop
    return usages
