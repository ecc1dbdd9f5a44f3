"""The store's literal types, repeated here so that the REST types (and the CLI that
decodes them) load without the database stack. A test checks they stay equal to
`cloud.store`'s."""

from __future__ import annotations

from typing import Literal

PriorityClass = Literal["p0", "p1", "p2"]
WorkState = Literal["pending", "scheduled", "running", "succeeded", "failed", "cancelled"]
AllocationState = Literal["assigned", "running"]
