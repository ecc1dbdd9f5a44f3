"""A pass's deployment step, before the scheduler runs: autoscaled deployments get
their new replica count (cloud/loop/autoscale.py), canary rollouts are promoted or
rolled back (cloud/loop/rollout.py), draining nodes' work is moved
(cloud/loop/drain.py), and deployments give back their surplus replicas
(cloud/loop/scaling.py). Its state (the autoscaler's history, the rollouts' watches)
lives on the leader and is reset when leadership is lost.

A deployment whose autoscaling or rollout decision fails (say, figures no rule
foresaw) is left as it is for that pass and logged, once per distinct error: the
scheduler runs after this step, so one deployment's failure would otherwise stop every
pass for the whole fleet."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping

import msgspec
import structlog

from cloud.fleet.registry import NodeRecord
from cloud.loop.allocations import by_work
from cloud.loop.autoscale import Autoscaler
from cloud.loop.drain import draining_nodes, plan_drain
from cloud.loop.rollout import RolloutWatch, rollout_event, settled_spec
from cloud.loop.scaling import (
    scaled_event,
    scaled_spec,
    serving_load,
    surplus_write,
)
from cloud.signals.grid import GridSignals
from cloud.store import (
    AllocationRecord,
    IllegalTransitionError,
    LeadershipLease,
    ModelRecord,
    PassWrite,
    PlacementWrite,
    Store,
    StoreSnapshot,
    VersionConflictError,
    WorkNotFoundError,
    WorkRecord,
)
from cloud.store.states import PLACED_STATES
from cloud.work.convert import spec_of
from cloud.work.explain import explanation_for_scaling
from cloud.work.specs import DeploymentSpec, encode_spec

# Commits a write as the loop does (its own-commit flag, the queue metrics); the
# records are the work as read before it.
Commit = Callable[[PassWrite, LeadershipLease, Mapping[str, WorkRecord]], Awaitable[None]]


def _rescaled(now: float, writes: Iterable[PlacementWrite]) -> dict[str, bytes]:
    """Fresh explanations for deployments that gave replicas back: the one of their
    last placement ("Placed 2 replicas ...") no longer holds."""
    return {
        write.work_id: explanation_for_scaling(now, [a.node_id for a in write.allocations])
        for write in writes
    }


class DeploymentControl:
    def __init__(self, store: Store, commit: Commit) -> None:
        self._store = store
        self._commit = commit
        self._autoscaler = Autoscaler()
        self._rollout_watch = RolloutWatch()
        self._specs: dict[str, tuple[int, DeploymentSpec]] = {}  # by work id, at a version
        # Registry records of the models rollouts bring, by id (immutable): the rollout
        # judge waits for canary replicas to report their sha256.
        self._canary_models: dict[str, ModelRecord] = {}
        # Decisions that failed: (step, work id) -> the error last logged for it.
        self._failing: dict[tuple[str, str], str] = {}
        self.grid = GridSignals(now_s=0.0, zones={})  # the latest pass's, for carbon caps
        # Placed deployments after the latest pass: id -> (tenant, desired, serving).
        self.replicas: dict[str, tuple[str, int, int]] = {}
        # Draining nodes whose drain waits, after the latest pass: node id -> why
        # (cloud/loop/drain.py; shown with the node), and what this leader last stored
        # of it for the replicas that do not lead (None: not read yet).
        self.drain_waiting: dict[str, tuple[str, ...]] = {}
        self._drain_waiting_stored: dict[str, tuple[str, ...]] | None = None
        self._log = structlog.get_logger("greenfed.loop")

    def reset(self) -> None:
        self._autoscaler.reset()
        self._rollout_watch.reset()
        self._failing = {}
        self.replicas = {}
        self.drain_waiting = {}
        self._drain_waiting_stored = None

    def _deployments(self, store: StoreSnapshot) -> Iterator[tuple[WorkRecord, DeploymentSpec]]:
        """Placed deployments with their specs, each decoded once per version (an
        unreadable one is the pass's to set aside)."""
        live = set()
        for record in store.work:
            if record.kind != "inference" or record.state not in PLACED_STATES:
                continue
            live.add(record.work_id)
            cached = self._specs.get(record.work_id)
            if cached is not None and cached[0] == record.version:
                yield record, cached[1]
                continue
            try:
                spec = spec_of(record)
            except (msgspec.DecodeError, ValueError):
                continue
            if isinstance(spec, DeploymentSpec):
                self._specs[record.work_id] = (record.version, spec)
                yield record, spec
        for work_id in set(self._specs) - live:
            del self._specs[work_id]

    async def run(
        self,
        store: StoreSnapshot,
        nodes: Mapping[str, NodeRecord],
        lease: LeadershipLease,
        now: float,
    ) -> tuple[StoreSnapshot, Mapping[str, int]]:
        """Autoscaled deployments' new replica counts, draining nodes' work moved
        (cloud/loop/drain.py), then every deployment's surplus replicas given back
        (cloud/loop/scaling.py). The snapshot after them, and the replacements draining
        deployments may hold beyond their count (for `build_inputs`)."""
        if await self._autoscale(store, nodes, now) | await self._rollouts(store, nodes, now):
            store = await self._store.load_snapshot(store)
        records = {record.work_id: record for record in store.work}
        deployments = {record.work_id: spec for record, spec in self._deployments(store)}
        drain = plan_drain(
            records, by_work(store.allocations), deployments, nodes, draining_nodes(nodes)
        )
        self.drain_waiting = {node: tuple(why) for node, why in drain.waiting.items()}
        if self._drain_waiting_stored is None:  # a new leader: what the last one left
            self._drain_waiting_stored = await self._store.drain_waiting()
        # Stored only when it changed: most passes write nothing for it.
        waiting_changed = self.drain_waiting != self._drain_waiting_stored
        if drain.writes or waiting_changed:
            for eviction in drain.evictions:
                self._log.info("work requeued", work_id=eviction.work_id, reason=eviction.reason)
            await self._commit(
                PassWrite(
                    evictions=tuple(drain.evictions),
                    placements=tuple(drain.releases),
                    explanations=_rescaled(now, drain.releases),
                    drain_waiting=self.drain_waiting if waiting_changed else None,
                ),
                lease,
                records,
            )
            self._drain_waiting_stored = self.drain_waiting
            if drain.writes:
                store = await self._store.load_snapshot(store)
        allocations = by_work(store.allocations)
        names = {tenant.tenant_id: tenant.name for tenant in store.tenants}
        surplus = []
        replicas: dict[str, tuple[str, int, int]] = {}
        for record, spec in self._deployments(store):
            members = allocations.get(record.work_id, ())
            load = serving_load(record.work_id, members, nodes)
            replicas[record.work_id] = (
                names.get(record.tenant_id, record.tenant_id),
                spec.replicas,
                load.ready_replicas if load is not None else 0,
            )
            if record.work_id in drain.held:
                continue  # the drain decides (its replacements are wanted)
            write = surplus_write(record, spec.replicas, members)
            if write is not None:
                surplus.append(write)
        self.replicas = replicas
        if not surplus:
            return store, drain.surge
        await self._commit(
            PassWrite(placements=tuple(surplus), explanations=_rescaled(now, surplus)), lease, {}
        )
        return await self._store.load_snapshot(store), drain.surge

    async def _rollouts(
        self, store: StoreSnapshot, nodes: Mapping[str, NodeRecord], now: float
    ) -> bool:
        """Canary rollouts promoted or rolled back (cloud/loop/rollout.py); whether any."""
        allocations = by_work(store.allocations)
        rollouts = [(r, spec) for r, spec in self._deployments(store) if spec.canary is not None]
        await self._load_canary_models([spec for _, spec in rollouts])
        watched: list[str] = []
        changed = False
        for record, spec in rollouts:
            watched.append(record.work_id)
            try:
                verdict = self._rollout_watch.judge(
                    record.work_id,
                    spec,
                    allocations.get(record.work_id, ()),
                    nodes,
                    now,
                    canary_sha256=self._canary_sha256(record, spec),
                )
            except Exception as error:
                self._decision_failed("rollout", record.work_id, error)
                continue
            self._failing.pop(("rollout", record.work_id), None)
            if verdict is None:
                continue
            if await self._settle_rollout(record, spec, verdict.outcome, verdict.reason):
                changed = True
        self._rollout_watch.forget(watched)
        self._forget_failures("rollout", watched)
        return changed

    async def _load_canary_models(self, specs: Iterable[DeploymentSpec]) -> None:
        """Fetch the registry records of rollouts' new models not seen yet; forget those
        of rollouts that ended."""
        wanted = {spec.canary.model_id for spec in specs if spec.canary is not None}
        missing = wanted - set(self._canary_models)
        if missing:
            self._canary_models.update(await self._store.models_by_id(sorted(missing)))
        for model_id in set(self._canary_models) - wanted:
            del self._canary_models[model_id]

    def _canary_sha256(self, record: WorkRecord, spec: DeploymentSpec) -> str | None:
        """The sha256 canary replicas report once they serve the rollout's model (None:
        none will: not in the registry, or another tenant's, which is never sent)."""
        model = self._canary_models.get(spec.canary.model_id) if spec.canary else None
        if model is None or model.tenant_id != record.tenant_id:
            return None
        return model.sha256

    def _decision_failed(self, step: str, work_id: str, error: Exception) -> None:
        """Log a deployment's failed decision, once until it fails otherwise or succeeds
        (it would fail again every pass). Call it in the `except` block: it logs the
        traceback."""
        described = f"{type(error).__name__}: {error}"
        if self._failing.get((step, work_id)) == described:
            return
        self._failing[(step, work_id)] = described
        self._log.exception("deployment decision failed; left as it is", step=step, work_id=work_id)

    def _forget_failures(self, step: str, active: Iterable[str]) -> None:
        keep = set(active)
        for key in [key for key in self._failing if key[0] == step and key[1] not in keep]:
            del self._failing[key]

    async def _settle_rollout(
        self, record: WorkRecord, spec: DeploymentSpec, outcome: str, reason: str
    ) -> bool:
        settled = settled_spec(spec, outcome)
        try:
            await self._store.update_spec(
                record.tenant_id,
                record.work_id,
                encode_spec(settled),
                expected_version=record.version,
            )
        except (VersionConflictError, WorkNotFoundError, IllegalTransitionError):
            return False  # changed under us: the next pass looks again
        await self._store.record_event(rollout_event(record, spec, outcome, reason))
        self._log.info("model rollout", work_id=record.work_id, outcome=outcome, reason=reason)
        return True

    async def _autoscale(
        self, store: StoreSnapshot, nodes: Mapping[str, NodeRecord], now: float
    ) -> bool:
        """Whether an autoscaled deployment's spec changed."""
        allocations = by_work(store.allocations)
        autoscaled: list[str] = []
        changed = False
        for record, spec in self._deployments(store):
            if spec.autoscale is None:
                continue
            autoscaled.append(record.work_id)
            members = allocations.get(record.work_id, ())
            try:
                decision = self._autoscaler.decide(
                    record.work_id,
                    spec.autoscale,
                    spec.replicas,
                    serving_load(record.work_id, members, nodes),
                    now_s=now,
                    intensity_g_per_kwh=self._intensity_where(members, nodes),
                    latency_slo_ms=spec.latency_slo_ms,
                )
            except Exception as error:
                self._decision_failed("autoscale", record.work_id, error)
                continue
            self._failing.pop(("autoscale", record.work_id), None)
            if decision is None:
                continue
            try:
                await self._store.update_spec(
                    record.tenant_id,
                    record.work_id,
                    encode_spec(scaled_spec(spec, decision.to_replicas)),
                    expected_version=record.version,
                )
            except (VersionConflictError, WorkNotFoundError, IllegalTransitionError):
                continue  # changed under us: the next pass looks again
            await self._store.record_event(scaled_event(record, decision))
            self._log.info(
                "deployment scaled",
                work_id=record.work_id,
                replicas=decision.to_replicas,
                reason=decision.reason,
            )
            changed = True
        self._autoscaler.forget(autoscaled)
        self._forget_failures("autoscale", autoscaled)
        return changed

    def _intensity_where(
        self, members: Iterable[AllocationRecord], nodes: Mapping[str, NodeRecord]
    ) -> float | None:
        """The mean recorded carbon intensity of the zones the replicas run in (the
        latest pass's grid)."""
        values = []
        for member in members:
            record = nodes.get(member.node_id)
            series = self.grid.series(record.status.zone) if record is not None else None
            if series is not None:
                values.append(series.carbon_at(self.grid.now_s))
        return sum(values) / len(values) if values else None
