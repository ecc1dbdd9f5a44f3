"""The scheduling loop: store + registry -> scheduler core -> store -> `desired`.

One pass:
1. read the store (one consistent snapshot) and the registry;
2. publish the `desired` document of every node whose generation moved (a tenant's
   cancellation, another replica's commit), after raising the generation of any node
   that applied more than the store holds (a restored store: generations.py);
3. apply what agents reported and which nodes are lost (reports.py; lost is
   cloud/fleet/liveness.py's verdict), commit;
   then the deployment step (deployment_control.py): autoscaling, canary rollouts,
   draining nodes, surplus replicas given back;
4. run the scheduler core on what is queued and, with a policy that migrates and
   unless the plan preempted, its migrator on the running, checkpointing training
   (moves.py): one pass rule the simulation shares
   (`cloud.green.pass_rule.schedule_then_move`); commit the plan (placements with
   their devices, preemptions, moves, pending reasons, explanations), publish the
   changed nodes.

Passes run when something happens (a commit by this process's API, a node state
change, an agent report), debounced, and at least every `scheduling.interval_s`
(or sooner when a start window opens or a deferral ends). Only the leader runs
passes: the store's leadership (an advisory lock on PostgreSQL, a file lock on
SQLite) decides, and every commit is checked against it, and so is every pass as it
starts. Its publisher asks too (`LeaseConfirmation`): before documents go out (at most
about once a second) and at once when another leader's newer document appears on a node,
so that a leader whose lock was taken over while it was paused stops at once instead of
overwriting the new leader's documents with its older ones until its next pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import msgspec
import structlog

from cloud.fleet.assignments import AssignmentIndex
from cloud.fleet.liveness import Liveness
from cloud.fleet.registry import NodeRecord, NodeRegistry
from cloud.green.latency import default_latency_estimator
from cloud.green.migration import Migrator
from cloud.green.pass_rule import PassDecision, schedule_then_move
from cloud.green.policies import (
    GreenInputs,
    build_migrator,
    build_policy,
    build_power_capper,
)
from cloud.green.room import RoomMaker
from cloud.loop.allocations import by_work
from cloud.loop.deployment_control import DeploymentControl
from cloud.loop.desired import desired_document
from cloud.loop.fair_share import FairShareLedger
from cloud.loop.generations import first_generations, generations_behind
from cloud.loop.hook_failures import HookFailureLog
from cloud.loop.inputs import ConversionCache, PassInputs, backing_off, build_inputs
from cloud.loop.moves import running_jobs
from cloud.loop.nodes import NodeViews
from cloud.loop.plans import Translation, translate
from cloud.loop.publisher import DesiredPublisher
from cloud.loop.queue_metrics import QueueMetrics
from cloud.loop.reports import agent_outcomes
from cloud.loop.unacknowledged import AssignmentWatch
from cloud.models.signing import ModelUrlSigner
from cloud.scheduler import Plan, Policy
from cloud.secrets.release import SecretRelease
from cloud.signals.grid import GridSignals
from cloud.signals.service import SignalService
from cloud.store import (
    CounterfactualRecord,
    LeadershipLease,
    LeadershipLostError,
    ModelRecord,
    PassWrite,
    Store,
    StoreSnapshot,
    StoreUnavailableError,
    VersionConflictError,
    WorkRecord,
)
from cloud.upgrades.controller import UpgradeController
from cloud.usage.accountant import Accountant
from cloud.usage.counterfactual import BASELINE, live_counterfactuals
from cloud.work.convert import spec_of
from cloud.work.dependencies import Resolution
from cloud.work.explain import explanation_for_waiting, explanations_for_plan
from cloud.work.specs import DeploymentSpec
from shared.settings import SchedulingSettings
from shared.tasks import stop_task

_ERROR_BACKOFF_S = 1.0
_METERING_START_S = 5.0


def of_this_cluster(nodes: Mapping[str, NodeRecord], cluster_id: str) -> dict[str, NodeRecord]:
    """`nodes` with every `reported` of another cluster (an agent still on documents from
    before a store reset) taken as observing nothing: its entries name that cluster's
    work, never ours. A report without a cluster id (schema < 1.3) still counts."""
    current: dict[str, NodeRecord] = {}
    for node_id, record in nodes.items():
        reported = record.reported
        if reported is not None and reported.cluster_id not in (None, cluster_id):
            record = dataclasses.replace(record, reported=None)
        current[node_id] = record
    return current


@dataclass(frozen=True, slots=True)
class PassFleet:
    """The fleet as a pass starts with it (`pass_fleet`)."""

    nodes: dict[str, NodeRecord]  # the registry's records by node id, in id order
    reporting: dict[str, NodeRecord]  # the same, reports of other clusters cleared
    # Node -> the generation the store must raise it to (`generations_behind`, and
    # `first_generations` for `foreign`: nodes on another cluster's document).
    floors: dict[str, int]
    foreign: frozenset[str]


def pass_fleet(
    records: Iterable[NodeRecord], cluster_id: str, generations: Mapping[str, int]
) -> PassFleet:
    """Pure, for a worker thread: at 10,000 nodes the sort, the cluster filter and the
    generation checks held the event loop for tens of ms at the start of every pass."""
    nodes = {record.node_id: record for record in sorted(records, key=lambda r: r.node_id)}
    reporting = of_this_cluster(nodes, cluster_id)
    floors = generations_behind(reporting, generations)
    foreign = first_generations(nodes, generations, cluster_id)
    floors |= foreign
    return PassFleet(nodes, reporting, floors, frozenset(foreign))


def fresh_explanations(
    plan: Plan, dependencies: Resolution, explained: dict[str, tuple[str, str, int]]
) -> dict[str, bytes]:
    """Explanations worth writing: every placement and preemption, and pending work
    whose reason changed since the last one this leader wrote (work waiting for its
    dependencies included); `explained` (the pending wording written, by work id) is
    updated: placed and preempted work leaves it."""
    placed_or_preempted = {placement.work_id for placement in plan.placements}
    placed_or_preempted.update(preemption.work_id for preemption in plan.preemptions)
    wanted = set(placed_or_preempted)
    for pending in plan.pending:
        key = (pending.code, pending.message, pending.members_placed)
        if explained.get(pending.work_id) != key:
            wanted.add(pending.work_id)
        explained[pending.work_id] = key
    explanations = explanations_for_plan(plan, wanted)
    for work_id, waiting in dependencies.waiting.items():
        key = ("dependency", waiting.message, 0)
        if explained.get(work_id) != key:
            explanations[work_id] = explanation_for_waiting(plan.now, waiting)
        explained[work_id] = key
    # Their stored explanation is now this placement or preemption: back in the queue
    # (requeued, its node lost, a failure retried at once), the first pass that finds
    # it waiting writes why, even in the words it waited in before it was placed.
    for work_id in placed_or_preempted:
        explained.pop(work_id, None)
    return explanations


def unexplained(explained: Mapping[str, object], store: StoreSnapshot) -> list[str]:
    """The work `explained` holds that `store` no longer has active (terminal, gone)."""
    active = {record.work_id for record in store.work}
    return [work_id for work_id in list(explained) if work_id not in active]


class LeaseConfirmation:
    """Answers the desired publisher's "does this process still lead?" from the lease,
    while the loop leads (`SchedulingLoop._lead` runs `run` beside the passes; its
    `LeadershipLostError` ends them).

    The check runs in this task, never the asker's: the publisher's tasks are cancelled
    whenever its broker connection drops, and a PostgreSQL lease check cancelled in the
    middle of its statement ends the lock's session (cloud/store/leadership.py), which
    would hand leadership away over an MQTT blip. Askers that come while a check is under
    way get the next one: it started after they asked."""

    def __init__(self, lease: LeadershipLease) -> None:
        self._lease = lease
        self._asked = asyncio.Event()
        self._answer: asyncio.Future[bool] | None = None  # the next check's
        self._ended = False
        self._log = structlog.get_logger("greenfed.loop")

    async def still_leading(self) -> bool:
        """False once the lease is lost, or once the loop stopped leading under it."""
        if self._ended:
            return False
        if self._answer is None:
            self._answer = asyncio.get_running_loop().create_future()
            self._asked.set()
        # Shielded: an asker cancelled while it waits leaves the answer to the others.
        return await asyncio.shield(self._answer)

    async def run(self) -> None:
        """Check the lease whenever asked; raise `LeadershipLostError` once it is lost."""
        checking: asyncio.Future[bool] | None = None
        try:
            while True:
                await self._asked.wait()
                self._asked.clear()
                checking, self._answer = self._answer, None
                if checking is None:
                    continue
                try:
                    await self._lease.check()
                except LeadershipLostError:
                    checking.set_result(False)
                    raise
                except Exception as error:
                    # The session answered (an error of the server's, not a lost session):
                    # it still holds the lock. The next pass's check and commits decide.
                    self._log.warning("leadership check failed", error=str(error))
                checking.set_result(True)
                checking = None
        finally:
            self._ended = True
            for waiting in (checking, self._answer):
                if waiting is not None and not waiting.done():
                    waiting.set_result(False)


@dataclass(slots=True)
class LoopStats:
    passes: int = 0
    commits: int = 0
    placed: int = 0
    evicted: int = 0
    migrated: int = 0
    conflicts: int = 0
    errors: int = 0
    last_pass_ms: float = 0.0


class SchedulingLoop:
    def __init__(
        self,
        store: Store,
        registry: NodeRegistry,
        publisher: DesiredPublisher,
        settings: SchedulingSettings,
        *,
        liveness: Liveness,
        assignments: AssignmentIndex | None = None,
        signals: SignalService | None = None,
        model_urls: ModelUrlSigner | None = None,
        accountant: Accountant | None = None,
        secrets: SecretRelease | None = None,
        upgrades: UpgradeController | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._registry = registry
        self._publisher = publisher
        # Documents are issued for each node's current agent instance, and sent again
        # when it changes: the answer to a new agent's birth (cloud/loop/publisher.py).
        publisher.follow_instances(registry)
        self._settings = settings
        self._liveness = liveness
        self._assignments = assignments  # ingestion's view of who runs what
        self._unacknowledged = AssignmentWatch(settings.assignment_timeout_s, monotonic)
        self._signals = signals
        self._model_urls = model_urls
        self._accountant = accountant  # live usage accounting (cloud/usage/)
        self._secrets = secrets  # seals jobs' secrets into the desired documents
        self._upgrades = upgrades  # agent versions nodes are asked to run (cloud/upgrades/)
        self.deployments = DeploymentControl(store, self._commit)
        self.fair_share = FairShareLedger(settings.fair_share_half_life_s, settings.cohorts)
        self._models: dict[str, ModelRecord] = {}  # immutable records, by id
        self._clock = clock
        self._monotonic = monotonic
        self._latency = default_latency_estimator()
        self._wake = asyncio.Event()
        self._own_commit = False
        self._explained: dict[str, tuple[str, str, int]] = {}
        # The scheduler's view of each work item, by (id, version): decoding specs is
        # most of a pass's cost when thousands of jobs are queued.
        self._converted = ConversionCache(settings.min_isolation)
        self._node_views = NodeViews()  # the scheduler's view of each node, kept while it holds
        self._last_snapshot: StoreSnapshot | None = None
        # What the latest desired documents were made from (every pass publishes, first
        # thing and again after it placed work, before `_last_snapshot` is set): a
        # cluster's bridge that submits a job as soon as its document comes finds it here.
        self._published_from: StoreSnapshot | None = None
        # That snapshot's work by id, built on first use (`work_record`).
        self._records_of: tuple[StoreSnapshot | None, dict[str, WorkRecord]] = (None, {})
        self._retry_at: float | None = None
        self._last_pass_end = 0.0  # monotonic
        self._last_move_check: float | None = None  # monotonic
        self._last_full_pass: float | None = None  # monotonic: the whole queue decided
        self.hook_failures = HookFailureLog(monotonic)
        self._log = structlog.get_logger("greenfed.loop")
        self.stats = LoopStats()
        self.queue = QueueMetrics()
        self.leading = asyncio.Event()
        # Set after every pass; tests and benchmarks wait on it instead of sleeping.
        self.pass_done = asyncio.Condition()

    # ---- triggers ----------------------------------------------------------------------

    def wake(self) -> None:
        """Something changed: run a pass soon. The loop's own commits do not count."""
        if not self._own_commit:
            self._wake.set()

    async def wait_for_pass(self) -> None:
        async with self.pass_done:
            await self.pass_done.wait()

    # ---- leadership --------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            async with self._store.leadership() as lease:
                self._log.info("scheduling leadership taken", policy=self._settings.policy)
                self.leading.set()
                try:
                    await self._lead(lease)
                except LeadershipLostError as error:
                    self._log.warning("scheduling leadership lost", error=str(error))
                finally:
                    self.leading.clear()
                    self._publisher.forget()
                    self._liveness.reset_grace()
                    self._unacknowledged.reset()
                    self.deployments.reset()
                    if self._upgrades is not None:
                        self._upgrades.reset()
                    self._explained.clear()
                    self._last_snapshot = None
                    self._published_from = None
                    self._last_full_pass = None
                    self.queue.forget_pending()
                    # What this process counted ends here: another leader counts from
                    # now on, and leading again starts from what it wrote.
                    self.fair_share = FairShareLedger(
                        self._settings.fair_share_half_life_s, self._settings.cohorts
                    )

    async def _lead(self, lease: LeadershipLease) -> None:
        """Lead until cancelled or the lease is lost (`LeadershipLostError`): found by a
        pass, or by the publisher's asking (`LeaseConfirmation`), which ends the pass or
        the wait under way at once."""
        confirmation = LeaseConfirmation(lease)
        self._publisher.confirm_leading = confirmation.still_leading
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(confirmation.run(), name="leadership-confirmation")
                await self._lead_passes(lease)
        except* LeadershipLostError as lost:
            raise lost.exceptions[0] from None
        finally:
            self._publisher.confirm_leading = None

    async def _lead_passes(self, lease: LeadershipLease) -> None:
        if self._settings.startup_settle_s:
            # Retained births arrive within moments of subscribing; a first pass before
            # them would see holes in the fleet (and count their nodes as lost sooner).
            await asyncio.sleep(self._settings.startup_settle_s)
        if self._accountant is None:
            await self._passes(lease)
            return
        metering = asyncio.create_task(self._accountant.run(lease), name="usage-metering")
        # Before the first pass if the store lets it: that pass's placements then get
        # their counterfactuals.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._accountant.started.wait(), _METERING_START_S)
        try:
            await self._passes(lease)
        finally:
            await stop_task(metering)

    async def _passes(self, lease: LeadershipLease) -> None:
        while True:
            self._wake.clear()
            try:
                await self.run_pass(lease)
            except VersionConflictError:
                self.stats.conflicts += 1  # work changed under the pass: plan again now
                self._wake.set()
            except (LeadershipLostError, asyncio.CancelledError):
                raise
            except StoreUnavailableError as error:
                self.stats.errors += 1
                self._log.warning("scheduling pass failed: store unavailable", error=str(error))
                await asyncio.sleep(_ERROR_BACKOFF_S)
            except Exception:
                self.stats.errors += 1
                self._log.exception("scheduling pass failed")
                await asyncio.sleep(_ERROR_BACKOFF_S)
            await self._wait_for_trigger()

    async def _wait_for_trigger(self) -> None:
        waiting_since = self._monotonic()
        timeout_s = self._settings.interval_s
        if self._retry_at is not None:
            timeout_s = max(0.0, min(timeout_s, self._retry_at - self._clock()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout_s)
        if self._wake.is_set():
            # Let the burst finish. Under a steady stream of triggers (a client submitting
            # hundreds of jobs a second) a pass starts no sooner than twice the last
            # one's duration after it ended: passes take at most about a third of the
            # time, the API keeps the rest, and each pass takes a bigger batch. A lone
            # trigger waits only the debounce.
            since_pass_s = self._monotonic() - self._last_pass_end
            busy_s = 2 * self.stats.last_pass_ms / 1000.0 - since_pass_s
            # But never past when the pass would have run without the trigger: the
            # duration is wall time, database waits included (the API shares the
            # database too), so a pass the process spent paused in (SIGSTOP, a frozen VM,
            # a long collection) counts the pause, and twice a 30 s pause left jobs
            # pending on idle nodes for a minute against "a pass at least every
            # interval_s".
            due_in_s = max(0.0, timeout_s - (self._monotonic() - waiting_since))
            gap_s = min(max(self._settings.debounce_s, busy_s), due_in_s)
            if gap_s:
                await asyncio.sleep(gap_s)

    async def current_policy(self) -> Policy:
        """The policy a pass would place work by now, with the grid's latest signals (a
        dry run's placement: cloud/loop/dry_run.py)."""
        green = await self._green_inputs(self._registry.nodes())
        return build_policy(self._settings.policy, green)

    def leading_fair_share(self) -> FairShareLedger | None:
        """The fair-share ledger this replica's passes use, while it leads and once it has
        loaded what the previous leader wrote (a dry run's: cloud/loop/dry_run.py)."""
        return self.fair_share if self.leading.is_set() and self.fair_share.loaded else None

    # ---- one pass ----------------------------------------------------------------------

    def work_record(self, work_id: str) -> WorkRecord | None:
        """A non-terminal work item as the latest desired documents were made from it
        (no store read: a cluster's bridge asks for a job's priority and deadline as it
        submits it, once its document names it)."""
        snapshot = self._published_from
        if snapshot is None:
            return None
        if self._records_of[0] is not snapshot:
            self._records_of = (snapshot, {record.work_id: record for record in snapshot.work})
        return self._records_of[1].get(work_id)

    async def run_pass(self, lease: LeadershipLease) -> Plan:
        started = time.perf_counter()
        # Leadership is otherwise checked only by a pass's writes: a leader whose lock
        # session died (a database restart, an admin's pg_terminate_backend) with
        # nothing to commit led on beside the replica that took the lock, and their
        # publishers rewrote each other's desired documents without end.
        await lease.check()
        now = self._clock()
        store = await self._store.load_snapshot(self._last_snapshot)
        # The records are the registry's own, which ingestion goes on updating (as ever
        # during a pass); the list of them is taken here, where the registry changes.
        fleet = await asyncio.to_thread(
            pass_fleet, list(self._registry), self._publisher.cluster_id, store.node_generations
        )
        nodes, reporting = fleet.nodes, fleet.reporting
        store = await self._catch_up_generations(store, fleet, lease)
        store = await self._step_upgrades(store, nodes, now, lease)
        await self._publish(store, nodes, now)

        records = {record.work_id: record for record in store.work}
        allocations = by_work(store.allocations)
        outcomes = agent_outcomes(
            records,
            allocations,
            reporting,
            self._liveness.lost_nodes({a.node_id for a in store.allocations}, nodes),
            now=now,
        )
        unacknowledged = self._unacknowledged.check(
            records,
            allocations,
            reporting,
            listening=self._liveness.listening(self._monotonic()),
            settled=outcomes.work_ids,
        )
        for node_id in sorted(unacknowledged.republish):
            if self._publisher.republish(node_id):
                self._log.info("desired republished", node_id=node_id, reason="unacknowledged")
        if outcomes.allocation_states:
            with self._committing():
                await self._store.set_allocation_states(
                    [(c.work_id, c.member_index, c.state) for c in outcomes.allocation_states]
                )
        if outcomes.changes_work or unacknowledged.changes_work:
            for state_change in outcomes.state_changes:
                self._log.info(
                    "work state",
                    work_id=state_change.work_id,
                    state=state_change.to_state,
                    reason=state_change.reason,
                )
            evictions = outcomes.evictions + unacknowledged.evictions
            for eviction in evictions:
                self._log.info("work requeued", work_id=eviction.work_id, reason=eviction.reason)
            await self._commit(
                PassWrite(
                    state_changes=outcomes.state_changes,
                    evictions=evictions,
                    placements=outcomes.placements + unacknowledged.placements,
                ),
                lease,
                records,
            )
            store = await self._store.load_snapshot(store)

        store, surge = await self.deployments.run(store, nodes, lease, now)
        green = await self._green_inputs(nodes.values())
        policy = build_policy(self._settings.policy, green)
        move_check = self._monotonic()
        migrator = self._migrator(green, move_check)
        room_maker = (
            RoomMaker(migrator, min_wait_s=self._settings.make_room_after_s)
            if migrator is not None and self._settings.make_room
            else None
        )
        capper = build_power_capper(self._settings.policy, green)
        max_attempts = self._store.max_attempts

        max_decisions = self._max_decisions(move_check)
        await self.fair_share.load(self._store)

        def decide() -> tuple[PassInputs, PassDecision, list[CounterfactualRecord], Translation]:
            # Off the event loop, the inputs too: converting thousands of newly queued
            # specs and the columns of thousands of nodes would hold up every request.
            # So are the explanations and the write: each walks the whole queue. The
            # caches are this thread's alone while it runs (one pass at a time).
            inputs = build_inputs(
                now, nodes.values(), store, self._converted, surge, node_views=self._node_views
            )
            inputs = self.fair_share.applied(inputs, now)
            running = running_jobs(inputs, max_attempts) if migrator else []
            decision = schedule_then_move(
                inputs.snapshot,
                policy,
                migrator,
                running,
                capper=capper,
                room_maker=room_maker,
                max_decisions=max_decisions,
            )
            counterfactuals = self._counterfactuals(inputs, decision.plan, green)
            explanations = fresh_explanations(decision.plan, inputs.dependencies, explained)
            translation = translate(decision.plan, inputs, explanations, decision.moves)
            return inputs, decision, counterfactuals, translation

        # What this leader wrote, updated by `decide` in a copy and taken once written: a
        # pass cancelled while its thread runs (leadership lost) or whose commit raised
        # (all or nothing: a version conflict, plan again) leaves the loop's own
        # untouched, so the next pass writes what this one could not.
        explained = self._explained.copy()
        inputs, decision, counterfactuals, translation = await asyncio.to_thread(decide)
        await self.fair_share.persist(self._store, move_check)
        if not decision.plan.undecided:
            self._last_full_pass = move_check
        if migrator is not None:
            self._last_move_check = move_check
        plan = decision.plan
        self.hook_failures.note(plan)
        for move in translation.moves:
            self._log.info("work moved", work_id=move.work_id, reason=move.explain())
        pass_write = translation.write
        writes = bool(
            translation.changes_work or pass_write.pending_reasons or pass_write.explanations
        )
        if writes:
            await self._commit(pass_write, lease, inputs.records)
        self._explained = explained
        if writes:
            self.stats.placed += translation.placed
            self.stats.evicted += translation.evicted
            self.stats.migrated += len(translation.moves)
            if translation.changes_work:
                store = await self._store.load_snapshot(store)
                await self._publish(store, nodes, now)
        # The queue's counts and what no longer needs an explanation walk the whole
        # queue: in a worker thread too, taken on the loop (a pass cancelled meanwhile
        # takes nothing).
        explained = self._explained
        tally, forgotten = await asyncio.to_thread(
            lambda: (
                self.queue.tally(plan, inputs.records, inputs.dependencies),
                unexplained(explained, store),
            )
        )
        self.queue.take(tally)
        if self._accountant is not None:
            self._accountant.note_pass(store, green.signals, counterfactuals)
        for work_id in forgotten:
            self._explained.pop(work_id, None)
        self._last_snapshot = store
        if self._assignments is not None:
            # Before the publisher sends what this pass placed: agents' first log chunks
            # and reports of new work find it known.
            self._assignments.replace_from(store)
        retry = [p.retry_at for p in plan.pending if p.retry_at is not None]
        # Failed jobs whose retry backoff ends: a pass then places them.
        retry.extend(r.not_before for r in store.work if r.not_before and backing_off(r, now))
        self._retry_at = min(retry) if retry else None
        self.stats.passes += 1
        self.stats.last_pass_ms = (time.perf_counter() - started) * 1000.0
        self._last_pass_end = self._monotonic()
        if translation.placed or translation.evicted:
            self._log.info(
                "scheduling pass",
                placed=translation.placed,
                preempted=translation.evicted,
                pending=len(plan.pending),
                ms=round(self.stats.last_pass_ms, 1),
            )
        async with self.pass_done:
            self.pass_done.notify_all()
        return plan

    def _counterfactuals(
        self, inputs: PassInputs, plan: Plan, green: GreenInputs
    ) -> list[CounterfactualRecord]:
        """The carbon-agnostic baseline's choice for work this plan places for the first
        time (cloud/usage/counterfactual.py)."""
        accountant = self._accountant
        if accountant is None:
            return []
        placed = sorted(
            {
                p.work_id
                for p in plan.placements
                if p.work_id in inputs.works
                and inputs.records[p.work_id].state == "pending"
                and accountant.needs_counterfactual(p.work_id)
            }
        )
        if not placed:
            return []
        works = [(inputs.works[w], inputs.records[w].tenant_id) for w in placed]
        baseline = build_policy(BASELINE, green)
        return live_counterfactuals(inputs.snapshot, works, plan, baseline, green.energy)

    def _max_decisions(self, now: float) -> int | None:
        """How much of the queue this pass decides: the head (`queue_depth`), unless it
        is time for a full pass (`full_pass_interval_s`; the first pass is one)."""
        depth = self._settings.queue_depth
        if not depth or self._last_full_pass is None:
            return None
        if now - self._last_full_pass >= self._settings.full_pass_interval_s:
            return None
        return depth

    def _migrator(self, green: GreenInputs, now: float) -> Migrator | None:
        """The policy's migrator when it is time to look for moves (at most every
        `migration_interval_s`), else None."""
        if self._last_move_check is not None and (
            now - self._last_move_check < self._settings.migration_interval_s
        ):
            return None  # before building the migrator: its grid windows cost something
        return build_migrator(self._settings.policy, green)

    @contextlib.contextmanager
    def _committing(self) -> Iterator[None]:
        self._own_commit = True
        try:
            yield
        finally:
            self._own_commit = False

    async def _commit(
        self, write: PassWrite, lease: LeadershipLease, before: Mapping[str, WorkRecord]
    ) -> None:
        """`before`: the work as the pass read it, against which the queue metrics
        measure what the commit changed."""
        with self._committing():
            result = await self._store.commit_pass(write, lease=lease)
        self.stats.commits += 1
        self.queue.note_commit(before, result.work)

    async def _green_inputs(self, nodes: Iterable[NodeRecord]) -> GreenInputs:
        zones = {record.status.zone for record in nodes}
        if self._signals is None:
            signals = GridSignals(now_s=self._clock(), zones={})
        else:
            signals = await self._signals.snapshot(zones)
        self.deployments.grid = signals
        return GreenInputs(
            signals=signals,
            latency=self._latency,
            min_saving=self._settings.shifting_min_saving,
            migration=self._settings.migration,
            migration_min_saving=self._settings.migration_min_saving,
            migration_cooldown_s=self._settings.migration_cooldown_s,
            power_capping=self._settings.power_capping,
            power_cap_min_saving=self._settings.power_capping_min_saving,
        )

    # ---- helpers -----------------------------------------------------------------------

    async def _models_of(self, records: Iterable[WorkRecord]) -> None:
        """Fetch the registry records of deployments' models not seen yet."""
        wanted = set()
        for record in records:
            if record.kind == "inference":
                with contextlib.suppress(msgspec.DecodeError, ValueError):
                    spec = spec_of(record)
                    assert isinstance(spec, DeploymentSpec)
                    wanted.add(spec.model_id)
                    if spec.canary is not None:
                        wanted.add(spec.canary.model_id)
        missing = wanted - set(self._models)
        if missing:
            self._models.update(await self._store.models_by_id(sorted(missing)))

    async def _catch_up_generations(
        self, store: StoreSnapshot, fleet: PassFleet, lease: LeadershipLease
    ) -> StoreSnapshot:
        """Raise the generation of nodes that applied more than the store holds (a store
        restored from a backup: generations.py), and give one to nodes still on another
        cluster's document (a store lost without one), so that they apply what we
        publish (`fleet.floors`, worked out against `store`)."""
        floors, foreign = fleet.floors, fleet.foreign
        if not floors:
            return store
        with self._committing():
            raised = await self._store.raise_generations(floors, lease=lease)
        for node_id, generation in sorted(raised.items()):
            self._log.warning(
                "desired generation raised past what the node applied",
                node_id=node_id,
                generation=generation,
                reason=(
                    "the node runs another cluster's document: the store was lost?"
                    if node_id in foreign
                    else "the store is older than the node's state: restored from a backup?"
                ),
            )
        return await self._store.load_snapshot(store)

    async def _step_upgrades(
        self,
        store: StoreSnapshot,
        nodes: Mapping[str, NodeRecord],
        now: float,
        lease: LeadershipLease,
    ) -> StoreSnapshot:
        """Move the agent rollout on; nodes whose document now names another agent
        version (or none) get a new generation, so that it goes out."""
        if self._upgrades is None:
            return store
        changed = await self._upgrades.step(nodes, now)
        if not changed:
            return store
        floors = {node_id: store.node_generations.get(node_id, 0) + 1 for node_id in changed}
        with self._committing():
            await self._store.raise_generations(floors, lease=lease)
        return await self._store.load_snapshot(store)

    async def _publish(
        self, store: StoreSnapshot, nodes: Mapping[str, NodeRecord], now: float
    ) -> None:
        self._published_from = store
        stale = [
            (node_id, generation)
            for node_id, generation in store.node_generations.items()
            if not self._publisher.is_current(node_id, generation)
        ]
        if not stale:
            return
        records = {record.work_id: record for record in store.work}
        allocations = by_work(store.allocations)
        await self._models_of(records.values())
        for node_id, generation in sorted(stale):
            self._publisher.submit(
                desired_document(
                    node_id,
                    generation,
                    now=now,
                    records=records,
                    allocations=allocations,
                    nodes=nodes,
                    settings=self._settings,
                    models=self._models,
                    signer=self._model_urls,
                    cluster_id=self._publisher.cluster_id,
                    secrets=self._secrets,
                    agent_upgrade=(self._upgrades.upgrade_for(node_id) if self._upgrades else None),
                )
            )
