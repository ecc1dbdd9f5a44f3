"""REST representations of nodes (what `/v1/nodes` returns), built from registry records."""

from __future__ import annotations

from datetime import datetime

import msgspec

from cloud.fleet.node_overlay import effective_labels, effective_taints, taint_text
from cloud.fleet.outage import Outage, OutageCause, OutageEnd
from cloud.fleet.registry import Approval, NodeRecord
from cloud.fleet.secret_receivers import receives_secrets
from shared.clock import utc_from_epoch
from shared.messages import (
    Accelerator,
    HostInfo,
    IsolationLevel,
    NodeState,
    OfflineReason,
    ResourceLimit,
    Site,
    Telemetry,
)


class OutageView(msgspec.Struct, frozen=True, kw_only=True):
    cause: OutageCause  # as judged while it lasted (cloud/fleet/outage.py)
    ended_by: OutageEnd  # "partition": the same agent came back; "restart": a new one
    offline_s: float
    ended_at: datetime


class NodeSummary(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    state: NodeState
    offline_reason: OfflineReason | None
    # While offline: stopped, crashed (its connection closed while it was talking),
    # partitioned (it went silent: unreachable, its agent may be working alone) or
    # broker (the broker ended its connection: it went down, or restarted).
    offline_cause: OutageCause | None = None
    last_outage: OutageView | None = None  # the latest outage that ended
    site: Site
    zone: str
    region: str
    labels: dict[str, str]  # the agent's, its join token's over them, an admin's over both
    taints: tuple[str, ...] = ()  # `key=value:Effect`, the agent's and an admin's
    cordoned: bool = False  # an admin stopped new work from landing here
    draining: bool = False  # ... and is moving its work elsewhere
    # While draining, what its drain waits for, e.g. "waiting: detector would fall below
    # min_available 2 (1 serving elsewhere)" (cloud/loop/drain.py; the scheduling
    # leader's latest pass).
    drain_waiting: tuple[str, ...] = ()
    agent_version: str
    instance_id: str
    accelerators: tuple[Accelerator, ...]
    accelerator_counts: dict[str, int]
    power_w: float | None
    accelerator_utilization_pct: float | None
    last_seen_at: datetime
    started_at: datetime
    observed_generation: int | None
    # How it contains training work, as its birth says (docs/isolation.md): null for a
    # node that runs none, or an agent older than schema 1.8.
    isolation: IsolationLevel | None = None
    isolation_note: str = ""
    resource_limits: tuple[ResourceLimit, ...] = ()
    container_runtimes: tuple[str, ...] = ()
    # Its birth announces a sealing key the control plane accepts, it is approved, and it
    # keeps tenants apart (isolation user or sandbox; a registered cluster, where it was
    # registered with accepts_secrets): the scheduler seals secrets to it.
    receives_secrets: bool = False
    # pending-approval: its birth says more than it enrolled (or was approved) as, in
    # `approval_differences`; it takes no new work until an admin approves it.
    approval: Approval = "approved"
    approval_differences: tuple[str, ...] = ()
    # An admin approved its own speed and power figures (else the model table's count).
    trusted_figures: bool = False


class NodeDetail(NodeSummary, frozen=True, kw_only=True):
    host: HostInfo
    telemetry_interval_s: float
    telemetry: Telemetry | None


class NodeList(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[NodeSummary, ...]
    count: int
    total: int
    next_cursor: str | None


# What a summary shows that changes with a node's state, its samples and its reports, in
# `NodeSummary`'s order; the rest changes only with its birth, what an admin set and its
# approval (cloud/fleet/node_pages.py encodes each part only when it changes).
STATE_FIELDS = ("state", "offline_reason", "offline_cause", "last_outage")
SAMPLE_FIELDS = ("power_w", "accelerator_utilization_pct", "last_seen_at")
REPORT_FIELDS = ("observed_generation",)


def summary_state_fields(record: NodeRecord) -> dict[str, object]:
    """`STATE_FIELDS`: whether it is online, and its outages."""
    return {
        "state": record.state,
        "offline_reason": record.offline_reason,
        "offline_cause": record.offline_cause if record.state == "offline" else None,
        "last_outage": _outage_view(record.last_outage),
    }


def summary_sample_fields(record: NodeRecord) -> dict[str, object]:
    """`SAMPLE_FIELDS`: its latest sample (of the devices it announced, their power as
    metering believes it), and when it was last heard."""
    # Imported here, not above: the CLI loads this module for its REST types, and the
    # metering rule brings the scheduling loop and the store with it.
    from cloud.usage.metrics import announced_samples, believed_node_power_w

    power_w: float | None = None
    utilization_pct: float | None = None
    telemetry = record.telemetry
    samples = [] if telemetry is None else announced_samples(record.status, telemetry)
    if samples:
        node_power_w = believed_node_power_w(samples)
        power_w = None if node_power_w is None else round(node_power_w, 2)
        # Average over accelerators other than the host CPU when there are any.
        devices = [sample for device, sample in samples if device.kind != "cpu"] or [
            sample for _, sample in samples
        ]
        utilization_pct = round(sum([s.utilization_pct for s in devices]) / len(devices), 2)
    return {
        "power_w": power_w,
        "accelerator_utilization_pct": utilization_pct,
        "last_seen_at": utc_from_epoch(record.last_seen_at),
    }


def summary_report_fields(record: NodeRecord) -> dict[str, object]:
    """`REPORT_FIELDS`: what its latest report says."""
    return {"observed_generation": record.reported.observed_generation if record.reported else None}


def summary_birth_fields(record: NodeRecord) -> dict[str, object]:
    """The summary's other fields (`drain_waiting` aside): what its birth says, what an
    admin set and its approval."""
    status = record.status
    counts: dict[str, int] = {}
    for accelerator in status.accelerators:
        counts[accelerator.kind] = counts.get(accelerator.kind, 0) + 1
    return {
        "node_id": status.node_id,
        "site": status.site,
        "zone": status.zone,
        "region": status.region,
        "labels": effective_labels(record),
        "taints": tuple(taint_text(t) for t in effective_taints(record)),
        "cordoned": record.admin is not None and record.admin.cordoned,
        "draining": record.admin is not None and record.admin.draining,
        "agent_version": status.agent_version,
        "instance_id": status.instance_id,
        "accelerators": status.accelerators,
        "accelerator_counts": counts,
        "started_at": utc_from_epoch(status.started_at),
        "isolation": status.isolation,
        "isolation_note": status.isolation_note,
        "resource_limits": status.resource_limits,
        "container_runtimes": status.container_runtimes,
        "receives_secrets": receives_secrets(record),
        "approval": record.approval,
        "approval_differences": record.awaiting_approval,
        "trusted_figures": record.admin is not None and record.admin.trust_figures,
    }


def _summary_fields(record: NodeRecord) -> dict[str, object]:
    return (
        summary_birth_fields(record)
        | summary_state_fields(record)
        | summary_sample_fields(record)
        | summary_report_fields(record)
    )


def _outage_view(outage: Outage | None) -> OutageView | None:
    if outage is None:
        return None
    return OutageView(
        cause=outage.cause,
        ended_by=outage.ended_by,
        offline_s=round(outage.offline_s, 1),
        ended_at=utc_from_epoch(outage.ended_at),
    )


def node_summary(record: NodeRecord, drain_waiting: tuple[str, ...] = ()) -> NodeSummary:
    return NodeSummary(**_summary_fields(record), drain_waiting=drain_waiting)  # type: ignore[arg-type]


def node_detail(record: NodeRecord, drain_waiting: tuple[str, ...] = ()) -> NodeDetail:
    return NodeDetail(
        **_summary_fields(record),  # type: ignore[arg-type]
        drain_waiting=drain_waiting,
        host=record.status.host,
        telemetry_interval_s=record.status.telemetry_interval_s,
        telemetry=record.telemetry,
    )
