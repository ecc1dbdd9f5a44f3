"""Canary model rollouts: whether a rollout's canary replicas are healthy, promoted or
rolled back.

Each pass reads the deployment's nodes' latest serving samples (each counted once,
by node and telemetry sequence number). Canary figures are the canary replicas' own,
the baseline's those of the deployment's other replicas, whether or not they share a
node (one edge box, or `max_replicas_per_node` above 1): an agent sends each
replica's figures within its deployment's (`ReplicaSample`, schema 1.13). An older
agent sends only the deployment's: its node counts wholly as canary when it serves a
canary replica, as baseline otherwise.

A canary replica serves the new model only once its node reports the new model's
sha256 for it: until the download and the swap are done the agent goes on serving the
old model, ready, and its figures are the old model's. So a canary node's samples
count, and the node counts as serving, only while it is online and every canary
replica on it reports the canary model's sha256 (from the node's current agent
instance), and only samples taken wholly after the watch first saw it do (the one that
spans the swap is part old model); the hold starts again whenever a canary node is not
serving the new model. The registry keeps an offline node's last report and sample: a
canary that crashed its node must not go on counting as healthy on them. When the
watch starts (again) on a node, only a sample it has not seen yet makes the node count
as serving, not one from before the node went away.

Gates, breached means rolled back at once:

- a canary replica failed, or its update to the new model did (its node reported it,
  e.g. the model would not load);
- once the canary answered `min_requests`, its error rate above `max_error_rate`;
- once the canary answered `min_requests`, its p95 latency above `max_p95_ratio` ×
  the baseline's (taken as at least 5 ms: a ratio of sub-millisecond latencies is
  noise). Both are the request-weighted mean of the p95 of every sample since the
  rollout began: one sample of a few requests says little (a single slow request on a
  busy host is its whole p95), so a gate on it rolled healthy canaries back.

Promoted when every canary replica has served the new model, without a breach, for
`hold_s`, and the canary has answered at least `min_requests`: the gates judge only
what the canary answered, so a canary that got no traffic has shown nothing (a model
failing every request would otherwise pass the hold unseen and go to every replica).
Until then it holds, waiting for traffic (`RolloutWatch.waiting`), for as long as it
takes; a person may promote it by hand. The watch lives in the leader's memory; a new
leader starts the hold again.

A rollout left with fewer than 2 replicas (scaled down by hand or by the autoscaler)
has no replica to compare with and none that keeps the deployment's model: it is rolled
back ("scaled to 1 replica").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from cloud.fleet.registry import NodeRecord
from cloud.loop.desired import canary_members
from cloud.loop.scaling import current_report
from cloud.store import AllocationRecord, NewEvent, WorkRecord
from cloud.work.specs import DeploymentSpec
from cloud.work.views import ROLLOUT_EVENT
from shared.messages import DeploymentSample, ReplicaSample, Telemetry

Outcome = Literal["promoted", "rolled-back"]
# The fewest replicas a rollout runs on: a canary and one that keeps the model.
ROLLOUT_MIN_REPLICAS = 2
P95_FLOOR_MS = 5.0  # the baseline p95 a canary's is compared with is at least this


@dataclass(frozen=True, slots=True)
class RolloutVerdict:
    outcome: Outcome
    reason: str


@dataclass(frozen=True, slots=True)
class _OnNewModel:
    """A canary node the watch sees on the new model."""

    # When the watch first saw it, on the node's clock (its report's `reported_at`),
    # which its samples' `sampled_at` is compared with.
    since_s: float
    # (agent instance, telemetry seq) of its sample the watch had already seen then,
    # which says nothing of the node since (None: none).
    seen_sample: tuple[str, int] | None

    def counts(self, telemetry: Telemetry) -> bool:
        """Whether a sample of the node is the new model's, taken since the watch began."""
        if telemetry.sampled_at - telemetry.interval_s < self.since_s:
            return False  # taken before the swap, or spanning it: part old model
        seen = self.seen_sample
        return seen is None or telemetry.instance_id != seen[0] or telemetry.seq > seen[1]


@dataclass(slots=True)
class _Watch:
    model_id: str
    serving_since_s: float | None = None
    on_new_model: dict[str, _OnNewModel] = field(default_factory=dict)  # by canary node
    requests: int = 0
    errors: int = 0
    # (node, agent instance, telemetry seq): a restarted agent numbers from 0 again.
    seen: set[tuple[str, str, int]] = field(default_factory=set)
    # Σ p95 × requests and Σ requests over the samples with a p95, canary and baseline.
    canary_latency: tuple[float, int] = (0.0, 0)
    baseline_latency: tuple[float, int] = (0.0, 0)
    # Why the latest judgement decided nothing yet, for a person (None: not judged).
    waiting: str | None = None


def _add_latency(
    total: tuple[float, int], p95_ms: float | None, requests: int
) -> tuple[float, int]:
    if p95_ms is None or requests <= 0:
        return total
    return total[0] + p95_ms * requests, total[1] + requests


def _mean_ms(total: tuple[float, int]) -> float | None:
    return total[0] / total[1] if total[1] else None


def _samples(
    watch: _Watch, work_id: str, node_ids: Iterable[str], nodes: Mapping[str, NodeRecord]
) -> Iterator[tuple[str, Telemetry, DeploymentSample, bool]]:
    """The latest serving sample of the work on each node that has one, with its node
    and telemetry, and whether it is new to the watch (each is counted once, by node
    and telemetry sequence number)."""
    for node_id in sorted(node_ids):
        record = nodes.get(node_id)
        sample = record.serving_sample(work_id) if record is not None else None
        telemetry = record.telemetry if record is not None else None
        if sample is None or telemetry is None:
            continue
        key = (node_id, telemetry.instance_id, telemetry.seq)
        new = key not in watch.seen
        watch.seen.add(key)
        yield node_id, telemetry, sample, new


def _split_by_replica(
    sample: DeploymentSample,
    node_id: str,
    node_of_member: Mapping[int, str],
    canary_members: frozenset[int],
    *,
    canary_node: bool,
) -> tuple[list[DeploymentSample | ReplicaSample], list[DeploymentSample | ReplicaSample]]:
    """A node's sample of the work as (the canary's figures, the other replicas')."""
    if not sample.replicas:  # an agent before 1.13: one sample for all its replicas
        return ([sample], []) if canary_node else ([], [sample])
    canary: list[DeploymentSample | ReplicaSample] = []
    baseline: list[DeploymentSample | ReplicaSample] = []
    for replica in sample.replicas:
        if node_of_member.get(replica.replica) != node_id:
            continue  # not placed there (any more): a withdrawn replica's last figures
        (canary if replica.replica in canary_members else baseline).append(replica)
    return canary, baseline


def _seen_sample(watch: _Watch, record: NodeRecord) -> tuple[str, int] | None:
    """(agent instance, seq) of the node's latest sample if the watch has seen it."""
    telemetry = record.telemetry
    if telemetry is None:
        return None
    key = (record.node_id, telemetry.instance_id, telemetry.seq)
    return (telemetry.instance_id, telemetry.seq) if key in watch.seen else None


def _update_failed(reason: str) -> bool:
    return reason.startswith("update to ") and " failed: " in reason


class RolloutWatch:
    def __init__(self) -> None:
        self._watches: dict[str, _Watch] = {}

    def reset(self) -> None:
        self._watches.clear()

    def forget(self, active: Iterable[str]) -> None:
        keep = set(active)
        for work_id in set(self._watches) - keep:
            del self._watches[work_id]

    def waiting(self, work_id: str) -> str | None:
        """What the rollout waits for after its latest judgement that decided nothing
        ("waiting for traffic: 3 of 20 requests"); None: not watched, or decided."""
        watch = self._watches.get(work_id)
        return watch.waiting if watch is not None else None

    def judge(
        self,
        work_id: str,
        spec: DeploymentSpec,
        members: Sequence[AllocationRecord],
        nodes: Mapping[str, NodeRecord],
        now_s: float,
        *,
        canary_sha256: str | None,
    ) -> RolloutVerdict | None:
        """`canary_sha256`: the sha256 of the canary model's file (None: not known, e.g.
        no longer in the registry; then no canary replica counts as serving it)."""
        canary = spec.canary
        if canary is None:
            return None
        watch = self._watches.get(work_id)
        if watch is None or watch.model_id != canary.model_id:
            watch = self._watches[work_id] = _Watch(canary.model_id)
        watch.waiting = None
        if spec.replicas < ROLLOUT_MIN_REPLICAS:
            return RolloutVerdict("rolled-back", f"scaled to {spec.replicas} replica")
        chosen = canary_members(spec, members)
        node_of_member = {m.member_index: m.node_id for m in members}
        canary_nodes = {m.node_id for m in members if m.member_index in chosen}
        # Canary nodes not serving the new model: gone, offline, or a canary replica on
        # them still serves another model (or says nothing).
        not_swapped: set[str] = set()
        reported_at: dict[str, float] = {}
        for member in members:
            if member.member_index not in chosen:
                continue
            record = nodes.get(member.node_id)
            report = current_report(record, work_id, member.member_index)
            if record is None or record.reported is None or report is None:
                not_swapped.add(member.node_id)
                continue
            if report.state == "failed" or _update_failed(report.reason):
                # An update that failed keeps the old model serving (edge/inference/runtime.py)
                # and says so: the canary never ran.
                return RolloutVerdict(
                    "rolled-back",
                    f"canary replica {member.member_index} failed: {report.reason or 'no reason'}",
                )
            if (
                record.state != "online"
                or canary_sha256 is None
                or report.model_sha256 != canary_sha256
            ):
                not_swapped.add(member.node_id)
            reported_at[member.node_id] = record.reported.reported_at
        for node_id in canary_nodes:
            if node_id in not_swapped:
                watch.on_new_model.pop(node_id, None)
            elif node_id not in watch.on_new_model:
                watch.on_new_model[node_id] = _OnNewModel(
                    reported_at[node_id], _seen_sample(watch, nodes[node_id])
                )
        serving = 0
        member_nodes = set(node_of_member.values())
        for node_id, telemetry, sample, new in _samples(watch, work_id, member_nodes, nodes):
            canary_node = node_id in canary_nodes
            canary_figures, baseline_figures = _split_by_replica(
                sample, node_id, node_of_member, chosen, canary_node=canary_node
            )
            on_new_model = watch.on_new_model.get(node_id) if canary_node else None
            # A canary's figures that are not the new model's are still marked seen, so
            # they never count later.
            if on_new_model is None or not on_new_model.counts(telemetry):
                canary_figures = []
            else:
                serving += 1
            if not new:
                continue
            for figures in canary_figures:
                watch.requests += figures.requests
                watch.errors += figures.errors
                watch.canary_latency = _add_latency(
                    watch.canary_latency, figures.latency_p95_ms, figures.requests
                )
            for figures in baseline_figures:
                watch.baseline_latency = _add_latency(
                    watch.baseline_latency, figures.latency_p95_ms, figures.requests
                )
        if watch.requests >= canary.min_requests:
            rate = watch.errors / watch.requests
            if rate > canary.max_error_rate:
                return RolloutVerdict(
                    "rolled-back",
                    f"canary error rate {rate:.1%} over {watch.requests} requests > "
                    f"{canary.max_error_rate:.1%}",
                )
        canary_p95 = _mean_ms(watch.canary_latency)
        baseline_p95 = _mean_ms(watch.baseline_latency)
        if watch.requests >= canary.min_requests and canary_p95 is not None and baseline_p95:
            # Below a few milliseconds a ratio is noise: a 0.2 ms p95 may double freely.
            ratio = canary_p95 / max(baseline_p95, P95_FLOOR_MS)
            if ratio > canary.max_p95_ratio:
                return RolloutVerdict(
                    "rolled-back",
                    f"canary p95 {canary_p95:.1f} ms is {ratio:.1f}× the other replicas' "
                    f"(> {canary.max_p95_ratio:g}×)",
                )
        if serving < len(canary_nodes) or not canary_nodes:
            watch.serving_since_s = None
            watch.waiting = "waiting for the canary replicas to serve the new model"
            return None
        if watch.serving_since_s is None:
            watch.serving_since_s = now_s
        held_s = now_s - watch.serving_since_s
        if watch.requests < canary.min_requests:
            # No gate has judged anything yet: without traffic a broken model looks healthy.
            watch.waiting = (
                f"waiting for traffic: {watch.requests} of {canary.min_requests} requests"
            )
            return None
        if held_s < canary.hold_s:
            watch.waiting = f"holding: {held_s:.0f} of {canary.hold_s:g} s"
            return None
        return RolloutVerdict(
            "promoted",
            f"healthy on {len(chosen)} canary replica(s) for {canary.hold_s:g} s "
            f"({watch.errors} errors in {watch.requests} requests)",
        )


def settled_spec(spec: DeploymentSpec, outcome: str) -> DeploymentSpec:
    """The spec once its rollout ends: the canary's model everywhere when promoted, the
    deployment's own otherwise."""
    canary = spec.canary
    assert canary is not None
    model_id = canary.model_id if outcome == "promoted" else spec.model_id
    return msgspec.structs.replace(spec, model_id=model_id, canary=None)


def rollout_event(record: WorkRecord, spec: DeploymentSpec, outcome: str, reason: str) -> NewEvent:
    """A rollout that started, was promoted, rolled back or aborted (`work.rollout`)."""
    canary = spec.canary
    payload = {
        "work_id": record.work_id,
        "outcome": outcome,
        "model_id": canary.model_id if canary is not None else spec.model_id,
        "previous_model_id": spec.model_id,
        "reason": reason,
    }
    return NewEvent(
        kind=ROLLOUT_EVENT,
        payload=msgspec.json.encode(payload),
        tenant_id=record.tenant_id,
        work_id=record.work_id,
    )
