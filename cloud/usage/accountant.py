"""The live accountant: meters every allocation from its node's telemetry and writes the
usage, batched, while this process leads scheduling.

- Ingestion hands it each accepted telemetry sample (`observe`, on the hot path). A
  sample whose every device gave its energy counter is held, replacing the node's
  previous one, and metered by the next flush: the counters' difference from the
  node's mark covers every sample in between exactly, so metering the latest once per
  flush counts what metering each would (the hourly split and an allocation's part of
  the step prorated over the longer step), at a fraction of the cost. Samples are
  metered one by one where that would not hold: power samples (integrated one by one),
  a counter refused as implausible, another agent instance, an allocation that ended
  and waits to be counted to its end. The increments wait in memory.
- After every pass the scheduling loop hands it the allocations, the tenants, the
  grid and the counterfactuals of work it placed (`note_pass`). Each term as leader
  starts from the store: what the accountant knew in an earlier term is let go when it
  stops leading (`_stop_leading`; another leader may have ended, placed and metered
  work meanwhile), and until the term's first pass tells the allocations, samples are
  held and no mark moves (`_hold_until_allocations`): a mark moved then would skip a
  span that the allocations it did not know yet ran in.
- Every `usage.flush_interval_s` one transaction, under the scheduling lease, adds
  the priced increments to the hourly rows and moves the nodes' marks
  (`Store.write_usage`). Telemetry is counted only past a node's stored mark, so a
  restart, a leader change, a replayed or retained sample never counts twice; what
  was in memory when a process died is counted again by the next leader from the
  marks (the energy counters' differences span the outage; without counters the
  model fills it, flagged as a gap).
- Work that held an allocation gets its final figures as a `work.usage` event once it
  ended (running then, or waiting again after a preemption) and its node's last
  telemetry had time to arrive (`usage.final_delay_s`); a leader starting finds the
  work that ran and an earlier leader did not tell (`begin`).
- A node the registry let go (revoked) is metered to the end of its allocations, then
  its mark is deleted with a flush and nothing of it is kept (`_departures`). A mark
  read at `begin` whose node the registry never held since is kept (not heard of yet
  after a restart) unless the store says the node is revoked: looked up at `begin` and
  hourly after (`_sweep_revoked`), so that the marks of nodes revoked while no leader
  saw them leave go too.
- /metrics' usage counters (`totals`) are this process's own counts, from zero when it
  started, exported only while it leads: summed across replicas (the dashboards'
  `sum(increase())`) each row counts once through failovers, fail-backs and restarts.

Only the leader meters; another replica's `observe` returns at once. Where replicas
share the telemetry (`mqtt.shared_group`), the leader hears the samples it took and the
others' digests (cloud/fleet/digest.py), whose samples it leaves encoded in the
registry where they would be held (`relayed`); the marks make each span count once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import msgspec
import structlog

from cloud.fleet.registry import NodeRegistry
from cloud.green.energy import EnergyModel
from cloud.signals.grid import HOUR_S, GridSignals
from cloud.store import (
    CounterfactualRecord,
    LeadershipLease,
    LeadershipLostError,
    NewEvent,
    Store,
    StoreSnapshot,
    StoreUnavailableError,
    UsageHour,
    UsageMark,
    UsageQuery,
    UsageWrite,
)
from cloud.store.usage import added_to, usage_key
from cloud.usage.meter import (
    MeteredAllocation,
    NodeMark,
    NodeProfile,
    held_power_limits_w,
    is_replay,
    mark_of,
    meter,
    profile_of,
    silent_increments,
    silent_mark,
    silent_samples,
)
from cloud.usage.pricing import Pieces, Priced, accumulate, merge, price_pieces
from cloud.usage.views import usage_summary
from shared.messages import Telemetry
from shared.settings import UsageSettings
from shared.work_literals import WorkKind

USAGE_EVENT = "work.usage"
# How far back a leader starting looks for work whose final figures were not told (an
# earlier leader stopped before they were due): hours of usage rows, by their index.
UNTOLD_LOOKBACK_S = 24 * 3600.0
# Held samples metered by a flush between two yields to the event loop.
_METERED_BETWEEN_YIELDS = 500
# How often a leader asks the store which of the nodes it holds marks of, and has not
# heard since it began, are revoked: revoked while unheard, the registry never held them
# to let go, and their marks would stay for ever.
REVOKED_SWEEP_INTERVAL_S = 3600.0

UsageTotalsKey = tuple[str, str, str]  # tenant id, zone, currency


@dataclass(slots=True)
class AccountingStats:
    flushes: int = 0
    rows_written: int = 0
    failed_flushes: int = 0
    replays: int = 0  # samples already counted (replayed, retained, duplicated)
    # Device steps whose counter or power could not be true (cloud/usage/meter.py),
    # counted by the next source down.
    implausible: int = 0
    last_flush_ms: float = 0.0


@dataclass(slots=True)
class TenantTotals:
    """What has been counted for one (tenant id, zone, currency), for /metrics: the rows
    as the store added them (`Store.write_usage`), so that the counters count what the
    store keeps. Every figure only grows: the emissions avoided, which may be negative,
    are the difference of two of them."""

    energy_j: float = 0.0
    gco2_g: float = 0.0
    cost: float = 0.0
    # Over the usage that has a counterfactual: the baseline's emissions, and the work's.
    counterfactual_gco2_g: float = 0.0
    gco2_with_counterfactual_g: float = 0.0

    @property
    def avoided_gco2_g(self) -> float:
        return self.counterfactual_gco2_g - self.gco2_with_counterfactual_g

    def add(self, row: UsageHour) -> None:
        self.energy_j += row.energy_j
        self.gco2_g += row.gco2_g
        self.cost += row.cost
        if row.counterfactual_gco2_g is not None:
            self.counterfactual_gco2_g += row.counterfactual_gco2_g
            self.gco2_with_counterfactual_g += row.gco2_g

    def add_growth(self, before: TenantTotals, after: TenantTotals) -> None:
        """Add how far the store's totals moved from `before` to `after` (never less than
        nothing: the store's sums may round differently from these)."""
        self.energy_j += max(0.0, after.energy_j - before.energy_j)
        self.gco2_g += max(0.0, after.gco2_g - before.gco2_g)
        self.cost += max(0.0, after.cost - before.cost)
        self.counterfactual_gco2_g += max(
            0.0, after.counterfactual_gco2_g - before.counterfactual_gco2_g
        )
        self.gco2_with_counterfactual_g += max(
            0.0, after.gco2_with_counterfactual_g - before.gco2_with_counterfactual_g
        )


@dataclass(slots=True)
class _Ending:
    tenant_id: str
    ended_at_s: float


@dataclass(slots=True)
class _LeaderState:
    marks: dict[str, NodeMark]
    counterfactuals: dict[str, CounterfactualRecord]
    # Nodes whose marks were read from the store at `begin` and that the registry has not
    # held since (not heard of yet after a restart): never taken for departed.
    unheard: set[str]
    dirty: set[str] = field(default_factory=set)
    pending: Pieces = field(default_factory=dict)  # metered since the last flush
    new_counterfactuals: list[CounterfactualRecord] = field(default_factory=list)
    # Decided by a pass, accepted by the next flush unless the store holds an earlier
    # decision (`_settle_proposed`): the first decision stands.
    proposed: dict[str, CounterfactualRecord] = field(default_factory=dict)
    # Nodes the registry let go (revoked): still holding allocations (`leaving`), or
    # their marks to be deleted by the next flush (`departed`, `_departures`).
    leaving: set[str] = field(default_factory=set)
    departed: set[str] = field(default_factory=set)
    registry_version: int = -1  # the registry's when `_departures` last looked at every mark
    # Nodes whose latest sample waits for the next flush to be metered (coalesced): the
    # sample itself, or None where it is the registry's latest (relayed, still encoded).
    held: dict[str, Telemetry | None] = field(default_factory=dict)
    # Before the term's first pass: the last sample of a node's earlier agent instance,
    # held beside the new instance's (`held`), which it is metered before: its counters
    # cover the span up to the restart exactly (`_hold_until_allocations`).
    held_before: dict[str, Telemetry] = field(default_factory=dict)
    # Nodes metered sample by sample: their latest metered sample lacked a device's
    # energy counter (power samples are integrated one by one) or had one refused.
    each_sample: set[str] = field(default_factory=set)
    # Work the store has no counterfactual for (asked once, until its final figures).
    without_counterfactual: set[str] = field(default_factory=set)
    # A flush whose commit's answer was lost (the store went away during it): whether
    # it committed is read from the marks it wrote, before the next flush writes.
    unknown: _Attempt | None = None
    # When `unheard` was last checked for revoked nodes (`_sweep_revoked`), our clock.
    revoked_swept_at_s: float = 0.0


@dataclass(slots=True)
class _Attempt:
    """A flush's write and what it was made of (to keep, should it not have committed)."""

    write: UsageWrite
    pending: Pieces
    dirty: set[str]
    new_counterfactuals: list[CounterfactualRecord]


def _counts_every_device(telemetry: Telemetry) -> bool:
    """Whether every device of the sample gave its energy counter (a loop, not `all`
    over a generator: on the hot path)."""
    for sample in telemetry.accelerators:  # noqa: SIM110 (see above)
        if sample.energy_j is None:
            return False
    return True


def _usage_marks(moved: Iterable[tuple[str, NodeMark]]) -> list[UsageMark]:
    return [
        UsageMark(node_id, m.instance_id, m.seq, m.sampled_at_s, dict(m.energy_j))
        for node_id, m in sorted(moved, key=lambda item: item[0])
    ]


class Accountant:
    def __init__(
        self,
        store: Store,
        registry: NodeRegistry,
        settings: UsageSettings,
        *,
        energy: EnergyModel | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._registry = registry
        self._settings = settings
        self._energy = energy or EnergyModel()
        self._clock = clock
        self._state: _LeaderState | None = None  # set while leading, marks loaded
        # What a term as leader learns from its passes, from nothing at each term
        # (`_stop_leading`): the allocations as the latest pass left them, per node.
        self._by_node: dict[str, list[MeteredAllocation]] = {}
        # Whether a pass of this term told the allocations (`note_pass`): until then no
        # sample is metered (`_hold_until_allocations`).
        self._knows_allocations = False
        # Each metered node's inventory as metering needs it, until its next birth.
        self._profiles: dict[str, NodeProfile] = {}
        # Nodes holding an allocation that ended, which their samples retire: every
        # other sample skips looking.
        self._ended_on: set[str] = set()
        self._implausible: list[str] = []  # the meter's, for the sample being metered
        self._warned_implausible: set[str] = set()  # nodes logged once
        self._work_tenants: dict[str, str] = {}  # work id -> tenant id, active work
        self._active_work: set[str] = set()
        # Active work that has held an allocation (here, or before a restart: it has usage
        # and no final figures): its end gets final figures, wherever it then was.
        self._ran: set[str] = set()
        # Work id -> tenant id of work with usage and no final figures, read by `begin`;
        # the next pass tells which of it ended.
        self._untold: dict[str, str] | None = None
        self._ending: dict[str, _Ending] = {}
        self._grid = GridSignals(now_s=0.0, zones={})
        # The signals' clock minus ours: a replayed trace runs in its own year, and an
        # interval is priced at the grid's hour that corresponds to it.
        self._grid_offset_s = 0.0
        self.tenant_names: dict[str, str] = {}
        # /metrics' usage counters (`UsageCollector`): this process's counts while it
        # leads, none while it does not. A demoted replica's would be stale, and its
        # store totals at the next term would jump by what other leaders counted
        # meanwhile (read by `increase()` as usage, counted twice in the sum).
        self.totals: dict[UsageTotalsKey, TenantTotals] = {}
        # What this process counted in all its terms as leader, from zero when it started
        # (a restart is a counter reset to Prometheus): a term goes on from the last.
        self._counted: dict[UsageTotalsKey, TenantTotals] = {}
        # The store's totals as this term knows them: a flush whose answer was lost but
        # that committed is counted by how far they moved (only the leader writes them).
        self._stored: dict[UsageTotalsKey, TenantTotals] = {}
        self.stats = AccountingStats()
        self.started = asyncio.Event()  # set while metering (marks loaded)
        self._log = structlog.get_logger("greenfed.usage")

    def metering(self) -> bool:
        """Whether this process meters now (it leads, its marks loaded): `observe` does
        nothing otherwise."""
        return self._state is not None

    @property
    def grid(self) -> GridSignals:
        """The latest pass's grid (empty before the first)."""
        return self._grid

    def grid_now_s(self) -> float:
        """Now on the signals' clock."""
        return self._clock() + self._grid_offset_s

    def tenant_of(self, work_id: str) -> str:
        """A work item's tenant name, "" when this process has not seen it."""
        return self.tenant_names.get(self._work_tenants.get(work_id, ""), "")

    # ---- from ingestion (hot path) -------------------------------------------------------

    def observe(self, telemetry: Telemetry) -> None:
        """A sample the registry accepted (this replica's, or a relayed one decoded):
        held for the next flush where its energy counters' difference will cover it
        (`_coalesces`), else metered now."""
        state = self._state
        if state is None:
            return
        node_id = telemetry.node_id
        mark = state.marks.get(node_id)
        if (
            mark is not None
            and self._coalesces(state, node_id, telemetry.instance_id, mark)
            and _counts_every_device(telemetry)
        ):
            if is_replay(telemetry, mark):
                self.stats.replays += 1
            else:
                state.held[node_id] = telemetry
            return
        if not self._knows_allocations:
            self._hold_until_allocations(state, node_id, telemetry, mark)
            return
        before = state.held_before.pop(node_id, None)
        if before is not None:
            self._meter(state, node_id, before)
        held = state.held.pop(node_id, None)
        if held is not None:
            # Counted up to the held sample first: it may be the last of the instance
            # before this one (its counters end there), or one held before the term's
            # first pass whose own step this sample (without counters, or a node's first)
            # would not cover.
            self._meter(state, node_id, held)
        self._meter(state, node_id, telemetry)

    def _hold_until_allocations(
        self, state: _LeaderState, node_id: str, telemetry: Telemetry, mark: NodeMark | None
    ) -> None:
        """A sample that comes before the term's first pass told the allocations (the
        coalescing ones are held anyway): the latest is held, metered once they are known.
        Metered now, it would move the mark past a span counted for nothing (a node whose
        allocations are not known yet holds none). A node without counters then gets the
        span up to its latest sample from the model, flagged as a gap."""
        if is_replay(telemetry, mark):
            self.stats.replays += 1
            return
        earlier = state.held.get(node_id)
        if earlier is not None and earlier.instance_id != telemetry.instance_id:
            # The agent restarted: its earlier instance's last sample is kept, else its
            # measured span up to the restart would be replaced by the model's guess.
            state.held_before[node_id] = earlier
        state.held[node_id] = telemetry

    def relayed(self, node_id: str, instance_id: str) -> bool:
        """Another replica's sample of the node was applied to the registry by its
        digest's index (cloud/fleet/digest.py): True when it is wanted decoded now
        (`observe`), False when the registry's latest will be metered at the next flush
        (or nothing meters here)."""
        state = self._state
        if state is None:
            return False
        mark = state.marks.get(node_id)
        if mark is None or not self._coalesces(state, node_id, instance_id, mark):
            return True
        state.held[node_id] = None  # newer than any sample held before
        return False

    def _coalesces(
        self, state: _LeaderState, node_id: str, instance_id: str, mark: NodeMark
    ) -> bool:
        """Whether a sample of the node's marked instance may wait for a later one: the
        counters' difference then covers both exactly. Not where power samples are
        integrated (`each_sample`), nor where an allocation ended and waits to be
        counted to its end and let go (`_retire_ended`)."""
        return (
            mark.instance_id == instance_id
            and node_id not in state.each_sample
            and node_id not in self._ended_on
        )

    def _meter(self, state: _LeaderState, node_id: str, telemetry: Telemetry) -> None:
        """Count the node's allocations from its mark to `telemetry`, and move the mark."""
        mark = state.marks.get(node_id)
        allocations = self._by_node.get(node_id)
        if not allocations and mark is not None and not is_replay(telemetry, mark):
            # Nothing runs there: only move the mark (its counters are the next
            # step's start).
            state.marks[node_id] = mark_of(telemetry, mark)
            state.dirty.add(node_id)
            state.unheard.discard(node_id)
            self._note_counters(state, node_id, telemetry)
            return
        record = self._registry.get(node_id)
        profile = self._profiles.get(node_id)
        if record is not None:
            status = record.status
            if profile is None or profile.inventory is not status:
                profile = self._profiles[node_id] = profile_of(status)
            power_limits_w = held_power_limits_w(record.reported, allocations or ())
        elif profile is not None:
            # Revoked since it took this sample (held for the flush): its last usage is
            # still counted, on the inventory it was metered by.
            status, power_limits_w = profile.inventory, {}
        else:
            return
        increments, new_mark = meter(
            status,
            telemetry,
            mark,
            allocations or (),
            host_overhead_ratio=self._energy.host_overhead_ratio,
            max_gap_s=self._settings.max_gap_s,
            power_limits_w=power_limits_w,
            implausible=self._implausible,
            profile=profile,
        )
        refused = bool(self._implausible)
        if refused:
            self._refused(node_id)
        if new_mark is mark:
            self.stats.replays += 1
            return
        assert new_mark is not None
        state.marks[node_id] = new_mark
        state.dirty.add(node_id)
        state.unheard.discard(node_id)
        self._note_counters(state, node_id, telemetry, refused=refused)
        zone = status.zone
        for increment in increments:
            accumulate(state.pending, Priced(increment, zone), self._grid_offset_s)
        self._retire_ended(node_id, new_mark.sampled_at_s)

    @staticmethod
    def _note_counters(
        state: _LeaderState, node_id: str, telemetry: Telemetry, *, refused: bool = False
    ) -> None:
        """Whether the node's next samples may be coalesced: every device of the sample
        just metered gave its energy counter, and none was refused."""
        if not refused and _counts_every_device(telemetry):
            state.each_sample.discard(node_id)
        else:
            state.each_sample.add(node_id)

    async def meter_held(self) -> None:
        """Meter every held node's latest sample (each flush does first), a few hundred
        at a time between yields: 10,000 nodes take about 80 ms, not to be spent at once
        on the event loop. Nothing before the term's first pass told the allocations:
        they wait for it (`_hold_until_allocations`)."""
        state = self._state
        if state is None or not self._knows_allocations:
            return
        before, state.held_before = state.held_before, {}
        for node_id, last in before.items():  # a few: agents restarted before the pass
            if not is_replay(last, state.marks.get(node_id)):
                self._meter(state, node_id, last)
        held, state.held = state.held, {}
        for count, (node_id, sample) in enumerate(held.items(), start=1):
            telemetry = sample
            if telemetry is None:  # relayed: the registry's latest, decoded and checked now
                record = self._registry.get(node_id)
                telemetry = record.telemetry if record is not None else None
                if telemetry is None:
                    continue
            # Unless a later sample was metered meanwhile (an allocation ended there).
            if not is_replay(telemetry, state.marks.get(node_id)):
                self._meter(state, node_id, telemetry)
            if count % _METERED_BETWEEN_YIELDS == 0:
                await asyncio.sleep(0)

    def _fill_silent_ends(self, state: _LeaderState) -> None:
        """Allocations that ended `usage.final_delay_s` ago (their final figures fall due)
        on a node whose samples have not counted them to their end: it stopped reporting,
        or never did. The model fills the rest, flagged as a gap (`_fill_silence`), so a
        node that suppresses its telemetry does not make its tenants' work free."""
        if not self._knows_allocations or not self._ended_on:
            return
        due_by_s = self._clock() - self._settings.final_delay_s
        for node_id in list(self._ended_on):
            allocations = self._by_node.get(node_id, [])
            ends_s = [
                a.ended_at_s
                for a in allocations
                if a.ended_at_s is not None and a.ended_at_s <= due_by_s
            ]
            if ends_s:
                self._fill_silence(state, node_id, allocations, max(ends_s))

    def _fill_silence(
        self,
        state: _LeaderState,
        node_id: str,
        allocations: Sequence[MeteredAllocation],
        end_s: float,
    ) -> None:
        """Count the node's allocations from its mark (or, without one, their start) to
        `end_s` by the model, move its mark there, and let go those that ended by then.
        A node the leader has no inventory of cannot be modelled: its allocations wait
        (`note_pass` lets them go after `usage.max_gap_s`)."""
        mark = state.marks.get(node_id)
        if mark is not None:
            start_s = mark.sampled_at_s
        else:
            start_s = min(a.started_at_s for a in allocations)
        start_s = max(start_s, end_s - self._settings.max_gap_s)
        if end_s > start_s:
            record = self._registry.get(node_id)
            profile = self._profiles.get(node_id)
            if record is not None:
                if profile is None or profile.inventory is not record.status:
                    profile = self._profiles[node_id] = profile_of(record.status)
                power_limits_w = held_power_limits_w(record.reported, allocations)
                last = record.telemetry
            elif profile is not None:  # revoked since: the inventory it was metered by
                power_limits_w, last = {}, None
            else:
                return
            samples = silent_samples(profile, last, allocations, self._assumed_utilisation_pct)
            increments = silent_increments(
                profile,
                samples,
                allocations,
                start_s,
                end_s,
                host_overhead_ratio=self._energy.host_overhead_ratio,
                power_limits_w=power_limits_w,
            )
            for increment in increments:
                accumulate(
                    state.pending, Priced(increment, profile.inventory.zone), self._grid_offset_s
                )
            state.marks[node_id] = silent_mark(mark, end_s)
            state.dirty.add(node_id)
            # Its next sample has no counters to compare with: metered on its own.
            state.each_sample.add(node_id)
        self._retire_ended(node_id, end_s)

    @property
    def _assumed_utilisation_pct(self) -> dict[WorkKind, float]:
        """What the energy model takes work to run at, per kind, where no sample says."""
        return {
            "training": self._energy.training_utilisation * 100.0,
            "inference": self._energy.inference_utilisation * 100.0,
        }

    def _refused(self, node_id: str) -> None:
        """Count a sample's implausible figures; say so once per node (a node that lies
        or whose counters broke would say it with every sample)."""
        devices, self._implausible = self._implausible, []
        self.stats.implausible += len(devices)
        if node_id not in self._warned_implausible:
            self._warned_implausible.add(node_id)
            self._log.warning(
                "implausible energy figures not metered",
                node_id=node_id,
                devices=sorted(set(devices)),
                why="more than the device's maximum power allows (cloud/usage/meter.py)",
            )

    def _retire_ended(self, node_id: str, counted_until_s: float) -> None:
        """Drop ended allocations of the node that its samples have now covered."""
        if node_id not in self._ended_on:
            return
        current = self._by_node.get(node_id, [])
        keep = [a for a in current if a.ended_at_s is None or a.ended_at_s > counted_until_s]
        if len(keep) != len(current):
            self._by_node[node_id] = keep
        if all(a.ended_at_s is None for a in keep):
            self._ended_on.discard(node_id)

    # ---- from the scheduling loop -----------------------------------------------------------

    def needs_counterfactual(self, work_id: str) -> bool:
        """Whether a pass that places the work should decide its counterfactual: none is
        known here (one the store holds is recalled by the next flush, and stands)."""
        state = self._state
        return (
            state is not None
            and work_id not in state.counterfactuals
            and work_id not in state.proposed
        )

    def note_pass(
        self,
        store: StoreSnapshot,
        grid: GridSignals,
        counterfactuals: Sequence[CounterfactualRecord] = (),
    ) -> None:
        """The allocations, tenants, grid and new counterfactuals after a pass (its
        snapshot: the store's state as this term's leader read it)."""
        now = self._clock()
        self._knows_allocations = True
        self._grid = grid
        if grid.zones:
            self._grid_offset_s = grid.now_s - now
        self.tenant_names = {t.tenant_id: t.name for t in store.tenants}
        state = self._state
        if state is not None:
            for decided in counterfactuals:
                if decided.work_id not in state.counterfactuals:
                    state.proposed.setdefault(decided.work_id, decided)
        live: dict[tuple[str, int, str], MeteredAllocation] = {}
        previous = {
            (a.work_id, a.member_index, a.node_id): a
            for allocations in self._by_node.values()
            for a in allocations
            if a.ended_at_s is None
        }
        replaced: list[MeteredAllocation] = []
        for allocation in store.allocations:
            key = (allocation.work_id, allocation.member_index, allocation.node_id)
            known = previous.get(key)
            if known is not None and known.started_at_s != allocation.started_at:
                # Placed again where it ran (a pass that rewrites placed work's rows):
                # the one before is counted to where the new one starts.
                replaced.append(
                    dataclasses.replace(
                        known,
                        ended_at_s=max(known.started_at_s, min(now, allocation.started_at)),
                    )
                )
            live[key] = (
                known
                if known is not None and known.started_at_s == allocation.started_at
                else MeteredAllocation(
                    work_id=allocation.work_id,
                    member_index=allocation.member_index,
                    tenant_id=allocation.tenant_id,
                    node_id=allocation.node_id,
                    accelerator_kind=allocation.accelerator_kind,
                    accelerators=allocation.accelerators,
                    accelerator_ids=allocation.accelerator_ids,
                    work_kind=allocation.work_kind,
                    started_at_s=allocation.started_at,
                )
            )
        by_node: dict[str, list[MeteredAllocation]] = {}
        for current in [*live.values(), *replaced]:
            by_node.setdefault(current.node_id, []).append(current)
        for node_id, metered in self._by_node.items():
            for one in metered:
                ended = one
                if one.ended_at_s is None:
                    if (one.work_id, one.member_index, one.node_id) in live:
                        continue  # still in place (or replaced above)
                    ended = dataclasses.replace(one, ended_at_s=max(now, one.started_at_s))
                elif now - one.ended_at_s > self._settings.max_gap_s:
                    continue  # its node never reported again: nothing more to count
                by_node.setdefault(node_id, []).append(ended)
        self._by_node = by_node
        # Only nodes that hold work are metered through a profile.
        self._profiles = {n: p for n, p in self._profiles.items() if n in by_node}
        self._ended_on = {
            node_id
            for node_id, allocations in by_node.items()
            if any(a.ended_at_s is not None for a in allocations)
        }
        self._note_endings(store, now)

    def _note_endings(self, store: StoreSnapshot, now: float) -> None:
        """Work that ran and is no longer active waits for its final figures: whether it
        was placed when it ended or waited again (preempted, requeued, suspended)."""
        active = {record.work_id for record in store.work}
        tenants, self._work_tenants = (
            self._work_tenants,
            {record.work_id: record.tenant_id for record in store.work},
        )
        self._ran.update(allocation.work_id for allocation in store.allocations)
        if self._untold is not None:  # the first pass since `begin`
            for work_id, tenant_id in self._untold.items():
                if work_id in active:
                    self._ran.add(work_id)
                else:  # ended while no leader could tell it
                    self._ending.setdefault(work_id, _Ending(tenant_id, now))
            self._untold = None
        for work_id in self._active_work - active:
            last_tenant_id = tenants.get(work_id)
            if work_id in self._ran and last_tenant_id is not None:
                self._ending[work_id] = _Ending(last_tenant_id, now)
        self._ran &= active
        self._active_work = active

    # ---- leading and flushing --------------------------------------------------------------

    async def begin(self, lease: LeadershipLease) -> None:
        """Start metering as the leader: read the marks (and which of their nodes are
        revoked), the totals, the active work's counterfactuals (before the first pass,
        so that it can add new ones) and the work whose final figures an earlier leader
        did not tell. The usage counters are exported from now on."""
        del lease  # reads need none; it is checked by every flush
        marks = await self._store.usage_marks()
        revoked = await self._revoked(marks)
        stored = await self._store_totals()
        since_s = self._clock() - UNTOLD_LOOKBACK_S
        untold = await self._store.untold_work(since_s - since_s % HOUR_S, f"{USAGE_EVENT}:")
        # Those of work that ran before (placed again, it keeps them: the first decision
        # stands) and of the work the last pass saw.
        known = await self._store.counterfactuals(sorted(self._active_work | untold.keys()))
        self._untold = untold
        self._state = _LeaderState(
            marks={
                node_id: NodeMark(m.instance_id, m.seq, m.sampled_at, m.energy_j)
                for node_id, m in marks.items()
            },
            counterfactuals=known,
            # A revoked node's mark is let go (`_departures`) even if never heard again.
            unheard=set(marks) - revoked,
            revoked_swept_at_s=self._clock(),
        )
        self._stored = stored
        # Every series the store has usage of, from zero where this process counted none
        # yet: `increase()` counts a series' first flush only from a sample before it.
        for key in stored:
            self._counted.setdefault(key, TenantTotals())
        self.totals = self._counted
        self._log.info(
            "usage metering started", nodes_marked=len(marks), marks_of_revoked=len(revoked)
        )

    def _stop_leading(self) -> None:
        """What this process kept as the leader that another leader now owns: the usage
        counters leave /metrics (the new leader's count from here on), and what it knew
        of the allocations and the work goes. Another leader may end, place and meter
        work meanwhile: kept, an allocation that ended there would be billed again here,
        to the next term's first pass, on top of what ran in its place. The next term
        starts from the store (its marks and untold work at `begin`, its first pass)."""
        self._state = None
        self.totals = {}
        self._stored = {}
        self._knows_allocations = False
        self._by_node = {}
        self._profiles = {}
        self._ended_on = set()
        self._implausible = []
        self._warned_implausible = set()
        self._work_tenants = {}
        self._active_work = set()
        self._ran = set()
        self._untold = None
        self._ending = {}

    async def _store_totals(self) -> dict[UsageTotalsKey, TenantTotals]:
        return {
            (total.tenant_id, total.zone, total.currency): TenantTotals(
                total.energy_j,
                total.gco2_g,
                total.cost,
                total.counterfactual_gco2_g,
                total.gco2_with_counterfactual_g,
            )
            for total in await self._store.usage_totals()
        }

    async def _revoked(self, node_ids: Collection[str]) -> set[str]:
        """Those of `node_ids` whose enrolment the store holds revoked (refused until
        they enrol again with a new token)."""
        if not node_ids:
            return set()
        return {
            record.node_id
            for record in await self._store.list_enrolled_nodes()
            if not record.active and record.node_id in node_ids
        }

    async def _sweep_revoked(self, state: _LeaderState) -> None:
        """Every `REVOKED_SWEEP_INTERVAL_S`: the unheard marks of nodes revoked since
        `begin` are looked at by `_departures` (a node revoked while the registry did
        not hold it never left it). A store that does not answer is asked again by the
        next flush."""
        now = self._clock()
        if not state.unheard or now - state.revoked_swept_at_s < REVOKED_SWEEP_INTERVAL_S:
            return
        try:
            revoked = await self._revoked(state.unheard)
        except StoreUnavailableError as error:
            self._log.warning("revoked nodes' marks not swept: store unavailable", error=str(error))
            return
        state.revoked_swept_at_s = now
        state.unheard -= revoked
        state.leaving |= revoked

    async def run(self, lease: LeadershipLease) -> None:
        """Meter while `lease` is held: `begin` (retried while the store is unavailable),
        then a flush every `flush_interval_s`; cancel to stop: a last flush is tried
        first (after the one under way, if any). A flush that fails keeps its usage for
        the next one."""
        flushing: asyncio.Future[None] | None = None
        try:
            while self._state is None:
                try:
                    await self.begin(lease)
                except StoreUnavailableError as error:
                    self._log.warning("usage metering waits for the store", error=str(error))
                    await asyncio.sleep(self._settings.flush_interval_s)
            self.started.set()
            while True:
                await asyncio.sleep(self._settings.flush_interval_s)
                # Shielded: cancelled halfway, a flush's usage would be neither written
                # nor kept (whether its transaction committed is not known then).
                flushing = asyncio.ensure_future(self.flush(lease))
                try:
                    await asyncio.shield(flushing)
                except LeadershipLostError:
                    raise
                except Exception:
                    self.stats.failed_flushes += 1
                    self._log.exception("usage flush failed")
        finally:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                async with asyncio.timeout(5.0):
                    if flushing is not None and not flushing.done():
                        await asyncio.wait([flushing])  # the one under way ends first
                    await self.flush(lease)
            self._stop_leading()
            self.started.clear()

    async def flush(self, lease: LeadershipLease) -> None:
        state = self._state
        if state is None:
            return
        started = time.perf_counter()
        if state.unknown is not None:
            try:
                await self._settle(state, state.unknown)
            except StoreUnavailableError as error:  # still away: the next flush asks again
                self.stats.failed_flushes += 1
                self._log.warning("usage flush failed: store unavailable", error=str(error))
                return
        await self.meter_held()
        self._fill_silent_ends(state)
        await self._sweep_revoked(state)
        self._departures(state)
        departed = sorted(state.departed)
        pending, state.pending = state.pending, {}
        dirty, state.dirty = state.dirty, set()
        new_counterfactuals, state.new_counterfactuals = state.new_counterfactuals, []
        # The marks as they stand now, with the usage just taken: ingestion moves them on
        # while this flush runs.
        moved = [(node_id, m) for node_id in dirty if (m := state.marks.get(node_id)) is not None]
        attempt: _Attempt | None = None
        try:  # from here to the commit: what fails keeps the usage for the next flush
            new_counterfactuals += await self._settle_proposed(state)
            await self._recall_counterfactuals(state, pending)
            rows = price_pieces(
                pending,
                self._grid,
                state.counterfactuals,
                pue=self._energy.pue,
                grid_offset_s=self._grid_offset_s,
            )
            # Made into rows in a worker thread (10,000 at 10,000 nodes).
            marks = await asyncio.to_thread(_usage_marks, moved)
            finals = await self._final_events(rows)
            write = UsageWrite(
                rows=rows,
                marks=marks,
                counterfactuals=new_counterfactuals,
                events=finals,
                departed=departed,
            )
            attempt = _Attempt(write, pending, dirty, new_counterfactuals)
            added = await self._store.write_usage(write, lease=lease)
        except LeadershipLostError:
            raise
        except Exception as error:
            if not isinstance(error, StoreUnavailableError):
                self._keep(state, pending, dirty, new_counterfactuals)
                raise
            self.stats.failed_flushes += 1
            self._log.warning("usage flush failed: store unavailable", error=str(error))
            if attempt is not None and attempt.write.marks:
                # Lost during the write: it may have committed, only its answer lost.
                state.unknown = attempt
            else:  # it never reached the store: nothing is lost while the process lives
                self._keep(state, pending, dirty, new_counterfactuals)
            return
        self._written(state, write)
        self._count(added)
        self.stats.last_flush_ms = (time.perf_counter() - started) * 1000.0

    @staticmethod
    def _keep(
        state: _LeaderState,
        pending: Pieces,
        dirty: set[str],
        new_counterfactuals: list[CounterfactualRecord],
    ) -> None:
        """A flush's usage back in front of what was metered since, for the next one."""
        merge(pending, state.pending)
        state.pending = pending
        state.dirty |= dirty
        state.new_counterfactuals = new_counterfactuals + state.new_counterfactuals

    def _written(self, state: _LeaderState, write: UsageWrite) -> None:
        """What a committed flush leaves behind: final figures told, departed nodes let
        go (the totals move on by what the store added: `_count`)."""
        for event in write.events:
            if event.work_id is not None:
                self._ending.pop(event.work_id, None)
                state.counterfactuals.pop(event.work_id, None)
                state.without_counterfactual.discard(event.work_id)
        for node_id in write.departed:
            state.departed.discard(node_id)
            if self._registry.get(node_id) is not None:
                # Back meanwhile (enrolled again): its mark is written again.
                state.dirty.add(node_id)
                continue
            state.marks.pop(node_id, None)
            state.held.pop(node_id, None)
            state.held_before.pop(node_id, None)
            state.dirty.discard(node_id)
            state.each_sample.discard(node_id)
            self._profiles.pop(node_id, None)
            self._warned_implausible.discard(node_id)
        self.stats.flushes += 1
        self.stats.rows_written += len(write.rows)

    def _departures(self, state: _LeaderState) -> None:
        """Nodes the registry let go (revoked) whose last usage is written: their marks
        go with the next flush. One that still holds an allocation is counted to its end
        first (`leaving`), one whose newest mark is not written yet waits for the flush
        that writes it, and one the registry has not held since this leader began is
        never taken for departed (not heard of yet, after a restart). Every mark is looked
        at when the registry's membership or states changed, else only the leaving."""
        registry = self._registry
        looked_at: Iterable[str] = state.leaving
        if registry.version != state.registry_version:
            state.registry_version = registry.version
            looked_at = state.marks
        leaving: set[str] = set()
        for node_id in list(looked_at):
            if registry.get(node_id) is not None:
                state.unheard.discard(node_id)
            elif node_id in state.unheard or node_id not in state.marks:
                continue
            elif self._by_node.get(node_id) or node_id in state.dirty or node_id in state.held:
                leaving.add(node_id)
            else:
                state.departed.add(node_id)
        state.leaving = leaving

    def _count(self, added: Iterable[UsageHour]) -> None:
        """The counters and the store's totals moved on by the rows as the store added
        them: an hour priced in another currency than its row's first adds no cost
        there, so none here."""
        for row in added:
            key = (row.tenant_id, row.zone, row.currency)
            self._counted.setdefault(key, TenantTotals()).add(row)
            self._stored.setdefault(key, TenantTotals()).add(row)

    def _count_moved(self, stored: dict[UsageTotalsKey, TenantTotals]) -> None:
        """The counters moved on by how far the store's totals did since this leader
        last knew them: only the leader writes usage, so by what its own flush added."""
        for key, after in stored.items():
            before = self._stored.get(key, TenantTotals())
            self._counted.setdefault(key, TenantTotals()).add_growth(before, after)
        self._stored = stored

    async def _settle(self, state: _LeaderState, attempt: _Attempt) -> None:
        """Whether a flush whose answer was lost committed, from the marks it wrote
        (marks and usage commit together, and nothing else writes them): if so it is
        done, else its usage goes back in front of what was metered since. Written
        twice, a flush would count its usage twice; dropped, not at all."""
        stored = await self._store.usage_marks()
        # Read before anything changes here: should it fail, the next flush asks again.
        stored_totals = await self._store_totals()
        first = attempt.write.marks[0]
        found = stored.get(first.node_id)
        state.unknown = None
        if found is not None and (found.instance_id, found.seq, found.sampled_at) == (
            first.instance_id,
            first.seq,
            first.sampled_at,
        ):
            self._written(state, attempt.write)
            # What the store added went with the answer: how far its totals moved.
            self._count_moved(stored_totals)
            self._log.info("usage flush with a lost answer had committed")
        else:
            self._keep(state, attempt.pending, attempt.dirty, attempt.new_counterfactuals)

    async def _settle_proposed(self, state: _LeaderState) -> list[CounterfactualRecord]:
        """The counterfactuals passes decided, accepted (and returned, to be written)
        unless the work has one already: the first decision stands, and one an earlier
        leader decided is read from the store (after a restart or a failover this process
        knows none of the work it did not price yet). What fails leaves them proposed."""
        if not state.proposed:
            return []
        decided = dict(state.proposed)
        unknown = [
            work_id
            for work_id in decided
            if work_id not in state.counterfactuals and work_id not in state.without_counterfactual
        ]
        stored = await self._store.counterfactuals(sorted(unknown)) if unknown else {}
        accepted = []
        for work_id, record in decided.items():
            state.proposed.pop(work_id, None)
            first = state.counterfactuals.get(work_id) or stored.get(work_id)
            if first is not None:
                state.counterfactuals[work_id] = first
                continue
            state.counterfactuals[work_id] = record
            state.without_counterfactual.discard(work_id)
            accepted.append(record)
        return accepted

    async def _recall_counterfactuals(self, state: _LeaderState, pending: Pieces) -> None:
        """The counterfactuals of work in `pending` that this process does not hold: an
        earlier leader decided them (a restart, a failover), or this one let them go
        with the work's final figures and a late sample came. Read from the store, where
        each was written with the first usage it priced; priced without, a row would
        lose the counterfactual it holds (`NULL + x` stays NULL)."""
        missing = {key[0] for key in pending}
        missing -= state.counterfactuals.keys()
        missing -= state.without_counterfactual
        if not missing:
            return
        found = await self._store.counterfactuals(sorted(missing))
        state.counterfactuals.update(found)
        state.without_counterfactual |= missing - found.keys()

    async def _final_events(self, rows: Sequence[UsageHour]) -> list[NewEvent]:
        now = self._clock()
        due = [
            (work_id, ending)
            for work_id, ending in self._ending.items()
            if now - ending.ended_at_s >= self._settings.final_delay_s
        ]
        if not due:
            return []
        stored = await self._store.usage(UsageQuery(work_ids=[work_id for work_id, _ in due]))
        events = []
        for work_id, ending in due:
            # The hour rows as this flush leaves them, added by the store's own rule: the
            # final figures say what the work's view will.
            mine = {usage_key(r): r for r in stored if r.work_id == work_id}
            for row in rows:
                if row.work_id == work_id:
                    key = usage_key(row)
                    held = mine.get(key)
                    mine[key] = row if held is None else added_to(held, row)
            summary = usage_summary(mine.values())
            events.append(
                NewEvent(
                    kind=USAGE_EVENT,
                    payload=msgspec.json.encode({"work_id": work_id, "usage": summary}),
                    tenant_id=ending.tenant_id,
                    work_id=work_id,
                    event_id=f"{USAGE_EVENT}:{work_id}",
                )
            )
        return events

    def allocations_on(self, node_id: str) -> Iterable[MeteredAllocation]:
        return tuple(self._by_node.get(node_id, ()))

    def open_allocations(self) -> Iterator[MeteredAllocation]:
        """The allocations the latest pass left in place (not ended), every node's: as
        many steps as allocations, not as nodes."""
        for allocations in self._by_node.values():
            for allocation in allocations:
                if allocation.ended_at_s is None:
                    yield allocation
