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
with nothing to replace is returned as it is.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from shared.messages import (
    NodeEvent,
    NodeStatus,
    ReportedState,
)
from shared.printable import printable

StructT = TypeVar("StructT", bound=msgspec.Struct)


def _with_printable(struct: StructT, *fields: str) -> StructT:
    """`struct` with the named text fields (a string, a tuple of strings, or None)
    printable; `struct` itself when each already was."""
    changes: dict[str, object] = {}
    for name in fields:
        value = getattr(struct, name)
        if isinstance(value, str):
            cleaned: object = printable(value)
            changed = cleaned is not value
        elif isinstance(value, tuple):
            cleaned = tuple(printable(item) for item in value)
            changed = any(a is not b for a, b in zip(cleaned, value, strict=True))
        else:
            continue  # None: nothing written
        if changed:
            changes[name] = cleaned
    return msgspec.structs.replace(struct, **changes) if changes else struct


def _tuple_of_printable(items: tuple[StructT, ...], *fields: str) -> tuple[StructT, ...]:
    """`items` with each one's named text fields printable; `items` itself if they were."""
    cleaned = tuple(_with_printable(item, *fields) for item in items)
    return items if all(a is b for a, b in zip(cleaned, items, strict=True)) else cleaned


def _replaced(struct: StructT, **parts: object) -> StructT:
    """`struct` with the parts that are not already its own (`is`) replaced."""
    changes = {name: part for name, part in parts.items() if part is not getattr(struct, name)}
    return msgspec.structs.replace(struct, **changes) if changes else struct


def printable_status(status: NodeStatus) -> NodeStatus:
    """A birth (or will) with its free text printable; `status` itself if it was."""
    upgrade = status.agent_upgrade
    status = _with_printable(status, "agent_version", "isolation_note", "container_runtimes")
    return _replaced(
        status,
        host=_with_printable(status.host, "hostname", "os", "arch"),
        accelerators=_tuple_of_printable(
            status.accelerators, "vendor", "model", "uuid", "health", "onnx_providers", "features"
        ),
        taints=_tuple_of_printable(status.taints, "key", "value"),
        agent_upgrade=(
            None if upgrade is None else _with_printable(upgrade, "version", "rollout_id", "detail")
        ),
    )


def printable_reported(reported: ReportedState) -> ReportedState:
    """A report with the free text of its entries printable; `reported` itself if it was."""
    return _replaced(
        reported,
        training=_tuple_of_printable(reported.training, "reason", "power_limit_note"),
        deployments=_tuple_of_printable(
            reported.deployments, "provider", "reason", "endpoint", "model_sha256"
        ),
    )


def printable_event(event: NodeEvent) -> NodeEvent:
    """An event with its subject and detail printable; `event` itself if they were."""
    return _with_printable(event, "subject", "detail")
