"""Rows to records and records to column values: the only place that knows both shapes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec
from sqlalchemy import Row

from cloud.store.records import (
    ACCELERATOR_KINDS,
    AllocationRecord,
    EventRecord,
    TenantRecord,
    WorkRecord,
)
from cloud.store.states import parse_hold, parse_state
from shared.messages import AcceleratorKind
from shared.work_literals import (
    ALLOCATION_STATES,
    PRIORITY_CLASSES,
    WORK_KINDS,
    AllocationState,
    PriorityClass,
    WorkKind,
)

_QUOTAS: Final = msgspec.json.Decoder(dict[AcceleratorKind, int])
# Quotas per kind and per MIG profile ("mig-1g.10gb"); limits are per kind only.
_QUOTA_RESOURCES: Final = msgspec.json.Decoder(dict[str, int])
_PRIORITIES: Final = msgspec.json.Decoder(tuple[PriorityClass, ...])
_IDS: Final = msgspec.json.Decoder(tuple[str, ...])
_ENCODER: Final = msgspec.json.Encoder()
_ANY_JSON: Final = msgspec.json.Decoder()


def encode_json(value: object) -> bytes:
    return _ENCODER.encode(value)


def check_json_object(document: bytes, what: str) -> None:
    """A JSON object, or ValueError naming `what`: the store keeps documents opaque but whole."""
    try:
        decoded = _ANY_JSON.decode(document)
    except msgspec.DecodeError as error:
        raise ValueError(f"{what} is not valid JSON: {error}") from None
    if not isinstance(decoded, dict):
        raise ValueError(f"{what} must be a JSON object")


def parse_kind(text: str) -> WorkKind:
    for kind in WORK_KINDS:
        if kind == text:
            return kind
    raise ValueError(f"unknown work kind {text!r}")


def parse_priority(text: str) -> PriorityClass:
    for priority in PRIORITY_CLASSES:
        if priority == text:
            return priority
    raise ValueError(f"unknown priority class {text!r}")


def parse_allocation_state(text: str) -> AllocationState:
    for state in ALLOCATION_STATES:
        if state == text:
            return state
    raise ValueError(f"unknown allocation state {text!r}")


def parse_accelerator_kind(text: str) -> AcceleratorKind:
    for kind in ACCELERATOR_KINDS:
        if kind == text:
            return kind
    raise ValueError(f"unknown accelerator kind {text!r}")


def quotas_json(quotas: Mapping[str, int] | Mapping[AcceleratorKind, int]) -> bytes:
    return encode_json(dict(sorted(quotas.items())))


def tenant_from_row(row: Row[Any]) -> TenantRecord:
    return TenantRecord(
        tenant_id=row.id,
        name=row.name,
        quotas=_QUOTA_RESOURCES.decode(row.quotas),
        borrowing_limit=_QUOTAS.decode(row.borrowing_limit),
        cohort=row.cohort,
        allowed_priorities=_PRIORITIES.decode(row.allowed_priorities),
        admin=bool(row.admin),
        created_at=float(row.created_at),
        max_running=None if row.max_running is None else int(row.max_running),
        max_queued=None if row.max_queued is None else int(row.max_queued),
        lending_limit=_QUOTAS.decode(row.lending_limit),
    )


def work_from_row(row: Row[Any]) -> WorkRecord:
    return WorkRecord(
        work_id=row.id,
        tenant_id=row.tenant_id,
        kind=parse_kind(row.kind),
        spec=row.spec,
        priority=parse_priority(row.priority),
        state=parse_state(row.state),
        state_reason=row.state_reason,
        attempts=int(row.attempts),
        submitted_at=float(row.submitted_at),
        updated_at=float(row.updated_at),
        idempotency_key=row.idempotency_key,
        version=int(row.version),
        failures=int(row.failures),
        not_before=None if row.not_before is None else float(row.not_before),
        hold=parse_hold(row.hold),
        requeues=int(row.requeues),
        submitted_spec_sha256=row.submitted_spec_sha256,
    )


def allocation_from_row(row: Row[Any]) -> AllocationRecord:
    """A row of allocations joined with work (tenant_id, work_kind, priority)."""
    return AllocationRecord(
        work_id=row.work_id,
        member_index=int(row.member_index),
        node_id=row.node_id,
        accelerator_kind=parse_accelerator_kind(row.accelerator_kind),
        accelerators=int(row.accelerators),
        accelerator_ids=_IDS.decode(row.accelerator_ids),
        host_memory_bytes=int(row.host_memory_bytes),
        started_at=float(row.started_at),
        expected_end=None if row.expected_end is None else float(row.expected_end),
        borrowed=bool(row.borrowed),
        state=parse_allocation_state(row.state),
        tenant_id=row.tenant_id,
        work_kind=parse_kind(row.work_kind),
        priority=parse_priority(row.priority),
        power_limit_w=None if row.power_limit_w is None else float(row.power_limit_w),
        cpu_cores=int(row.cpu_cores),
    )


def event_from_row(row: Row[Any]) -> EventRecord:
    return EventRecord(
        seq=int(row.seq),
        tenant_id=row.tenant_id,
        work_id=row.work_id,
        kind=row.kind,
        payload=row.payload,
        at=float(row.at),
        event_id=row.event_id,
    )
