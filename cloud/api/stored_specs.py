"""A work's stored spec read back by the API: as a view shows it, or as a change needs it.

A spec a newer greenfed wrote (during a rolling upgrade) may hold fields this version
does not know. A view shows the fields it knows (`shown_spec`): never a 500 for the work.
A change stores the spec again, so it reads it exactly (`exact_spec`): the fields this
version does not know would be lost. What the one or the other cannot read is a 409
`spec-unreadable` for that work alone (a listing shows the rest: cloud/api/work.py).
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from cloud.api.problems import Problem
from cloud.store import WorkRecord
from cloud.work.specs import DeploymentSpec, TrainingJobSpec

SpecT = TypeVar("SpecT", TrainingJobSpec, DeploymentSpec)


def spec_unreadable(record: WorkRecord) -> Problem:
    return Problem(
        409,
        "spec-unreadable",
        "Spec unreadable",
        f"the stored spec of {record.work_id} cannot be read by this greenfed "
        "(written by a newer version?): ask a control plane of that version",
    )


def known_spec(decoder: msgspec.json.Decoder[SpecT], record: WorkRecord) -> SpecT | None:
    """The stored spec with the fields this version knows; None: not even those make a
    spec this version accepts (a limit broken, a field's type changed)."""
    try:
        return decoder.decode(record.spec)
    except (msgspec.DecodeError, ValueError):
        pass
    spec_type = decoder.type
    try:
        fields = msgspec.json.decode(record.spec)
        known = set(spec_type.__struct_fields__)
        spec: SpecT = msgspec.convert(
            {name: value for name, value in fields.items() if name in known}, spec_type
        )
    except (msgspec.DecodeError, ValueError, TypeError, AttributeError):
        return None
    return spec


def shown_spec(decoder: msgspec.json.Decoder[SpecT], record: WorkRecord) -> SpecT:
    """The stored spec as a view shows it: the fields this version knows."""
    spec = known_spec(decoder, record)
    if spec is None:
        raise spec_unreadable(record)
    return spec


def exact_spec(decoder: msgspec.json.Decoder[SpecT], record: WorkRecord) -> SpecT:
    """The stored spec exactly, for a change that stores it again."""
    try:
        return decoder.decode(record.spec)
    except (msgspec.DecodeError, ValueError):
        raise spec_unreadable(record) from None
