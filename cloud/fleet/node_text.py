"""A node's words as printable text: the free text of its births, reports and events with
every control character replaced (shared/printable.py), once, as ingestion takes them
(cloud/fleet/ingest.py).

What a node writes for people (a run's or a replica's reason, its execution provider
and endpoint, a power limit note, an accelerator's model and health, its taints, its
isolation note, an agent upgrade's detail, an event's subject and detail) is stored
(a failure reason becomes the work's reason and its event) and shown (`greenfed
nodes`, `greenfed job`). PostgreSQL refuses NUL in text, so a reason holding one would
fail every scheduling pass that writes it; ESC, CSI and CR would reach a terminal. Ids
are not rewritten here (what they name must stay what the node meant): a birth whose
instance or accelerator ids hold control characters is refused as `invalid_name`
(cloud/fleet/plausibility.py).

Telemetry carries no free text and is not looked at: it is the hot path. A message
with nothing to replace is returned as it is, after one scan of its text.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from shared.messages import (
    Accelerator,
    AgentUpgradeReport,
    NodeEvent,
    NodeStatus,
    ReportedDeployment,
    ReportedState,
    ReportedTraining,
)
from shared.printable import has_control, printable


def _accelerator_texts(accelerator: Accelerator) -> Iterator[str]:
    yield accelerator.vendor
    yield accelerator.model
    yield accelerator.uuid or ""
    yield accelerator.health
    yield from accelerator.onnx_providers
    yield from accelerator.features


def _status_texts(status: NodeStatus) -> Iterator[str]:
    yield status.agent_version
    yield status.isolation_note
    yield status.host.hostname
    yield status.host.os
    yield status.host.arch
    yield from status.container_runtimes
    for accelerator in status.accelerators:
        yield from _accelerator_texts(accelerator)
    for taint in status.taints:
        yield taint.key
        yield taint.value
    upgrade = status.agent_upgrade
    if upgrade is not None:
        yield upgrade.version
        yield upgrade.rollout_id
        yield upgrade.detail


def _texts(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(printable(value) for value in values)


def _accelerator(accelerator: Accelerator) -> Accelerator:
    if not has_control("".join(_accelerator_texts(accelerator))):
        return accelerator
    return msgspec.structs.replace(
        accelerator,
        vendor=printable(accelerator.vendor),
        model=printable(accelerator.model),
        uuid=None if accelerator.uuid is None else printable(accelerator.uuid),
        health=printable(accelerator.health),
        onnx_providers=_texts(accelerator.onnx_providers),
        features=_texts(accelerator.features),
    )


def _upgrade(upgrade: AgentUpgradeReport | None) -> AgentUpgradeReport | None:
    if upgrade is None:
        return None
    return msgspec.structs.replace(
        upgrade,
        version=printable(upgrade.version),
        rollout_id=printable(upgrade.rollout_id),
        detail=printable(upgrade.detail),
    )


def printable_status(status: NodeStatus) -> NodeStatus:
    """A birth (or will) with its free text printable; `status` itself if it was."""
    if not has_control("".join(_status_texts(status))):
        return status
    host = status.host
    return msgspec.structs.replace(
        status,
        agent_version=printable(status.agent_version),
        isolation_note=printable(status.isolation_note),
        host=msgspec.structs.replace(
            host,
            hostname=printable(host.hostname),
            os=printable(host.os),
            arch=printable(host.arch),
        ),
        container_runtimes=_texts(status.container_runtimes),
        accelerators=tuple(_accelerator(accelerator) for accelerator in status.accelerators),
        taints=tuple(
            msgspec.structs.replace(taint, key=printable(taint.key), value=printable(taint.value))
            for taint in status.taints
        ),
        agent_upgrade=_upgrade(status.agent_upgrade),
    )


def _training(entry: ReportedTraining) -> ReportedTraining:
    if not has_control(entry.reason + entry.power_limit_note):
        return entry
    return msgspec.structs.replace(
        entry, reason=printable(entry.reason), power_limit_note=printable(entry.power_limit_note)
    )


def _replica_texts(entry: ReportedDeployment) -> str:
    return "".join(
        (entry.provider or "", entry.reason, entry.endpoint or "", entry.model_sha256 or "")
    )


def _replica(entry: ReportedDeployment) -> ReportedDeployment:
    if not has_control(_replica_texts(entry)):
        return entry
    return msgspec.structs.replace(
        entry,
        provider=None if entry.provider is None else printable(entry.provider),
        reason=printable(entry.reason),
        endpoint=None if entry.endpoint is None else printable(entry.endpoint),
        model_sha256=None if entry.model_sha256 is None else printable(entry.model_sha256),
    )


def printable_reported(reported: ReportedState) -> ReportedState:
    """A report with the free text of its entries printable; `reported` itself if it was."""
    texts = [entry.reason + entry.power_limit_note for entry in reported.training]
    texts.extend(_replica_texts(entry) for entry in reported.deployments)
    if not has_control("".join(texts)):
        return reported
    return msgspec.structs.replace(
        reported,
        training=tuple(_training(entry) for entry in reported.training),
        deployments=tuple(_replica(entry) for entry in reported.deployments),
    )


def printable_event(event: NodeEvent) -> NodeEvent:
    """An event with its subject and detail printable; `event` itself if they were."""
    if not has_control((event.subject or "") + event.detail):
        return event
    return msgspec.structs.replace(
        event,
        subject=None if event.subject is None else printable(event.subject),
        detail=printable(event.detail),
    )
