"""Bounds on long-lived responses (SSE, followed logs): a slot per stream, per tenant."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Final

from cloud.api.problems import Problem, problem_reply
from cloud.api.routes import Reply
from cloud.tenant_slots import TenantSlots

RETRY_AFTER_S: Final = 5

# What a stream route answers when `StreamLimits.slot` refuses it: its replies list them.
STREAM_REFUSALS: Final[tuple[Reply, ...]] = tuple(
    dataclasses.replace(problem_reply(status, description), headers=("Retry-After",))
    for status, description in (
        (429, "The tenant has as many streams open as it may: close one, or retry later"),
        (503, "The server has as many streams open as it serves: retry later"),
    )
)


class StreamLimits:
    def __init__(self, *, max_streams: int, max_per_tenant: int) -> None:
        self._slots = TenantSlots(most=max_streams, most_per_tenant=max_per_tenant)

    @property
    def open_streams(self) -> int:
        return self._slots.held

    def slot(self, tenant_id: str) -> contextlib.AbstractContextManager[None]:
        """Hold a stream slot for the block, or raise a 429 problem (the tenant has its
        share open) or a 503 (the server has its limit open) when none is free."""
        return self._slots.slot(tenant_id, self._refused)

    def _refused(self, per_tenant: bool) -> Problem:
        if per_tenant:
            return Problem(
                429,
                "too-many-streams",
                "Too many open streams",
                f"this tenant has its share of open streams (at most "
                f"{self._slots.most_per_tenant}; fewer while the server is nearly at its "
                "limit, the last one kept for a tenant with none open); close one",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        return Problem(
            503,
            "too-many-streams",
            "Too many open streams",
            "the server is at its stream limit; retry later",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
