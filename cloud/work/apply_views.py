"""What `PUT /v1/jobs/{name}`, `PUT /v1/deployments/{name}` and the dry runs answer."""

from __future__ import annotations

from typing import Literal

import msgspec

from cloud.work.explanation import Explanation
from cloud.work.spec_changes import FieldChange
from shared.work_literals import SpecKind, WorkState

ApplyAction = Literal["created", "updated", "unchanged"]


class DryRunView(msgspec.Struct, frozen=True, kw_only=True):
    """Where the work would go if submitted now: nothing was stored."""

    kind: SpecKind
    name: str
    message: str  # one line for a person
    explanation: Explanation | None = None  # as GET .../explain would show it
    # Jobs its depends_on names: it would start only once they end as asked.
    waits_for: tuple[str, ...] = ()


class ApplyView(msgspec.Struct, frozen=True, kw_only=True):
    """What applying the spec by name did (with `dry_run`: would do)."""

    action: ApplyAction
    dry_run: bool
    kind: SpecKind
    name: str
    id: str | None  # None: a dry run that would create it
    state: WorkState | None
    message: str
    changes: tuple[FieldChange, ...] = ()  # updated: each changed field, before and after
    placement: DryRunView | None = None  # a dry run that would create it: where it would go
