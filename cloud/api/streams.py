"""Bounds on long-lived responses (SSE, followed logs): a slot per stream, per tenant."""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Iterator
from typing import Final

from cloud.api.problems import Problem, problem_reply
from cloud.api.routes import Reply

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
        self._max_streams = max_streams
        self._max_per_tenant = max_per_tenant
        self._open: Counter[str] = Counter()

    @property
    def open_streams(self) -> int:
        return sum(self._open.values())

    @contextlib.contextmanager
    def slot(self, tenant_id: str) -> Iterator[None]:
        """Hold a stream slot for the block, or raise a 429 problem (the tenant has its
        share open) or a 503 (the server has its limit open) when none is free."""
        if self._open[tenant_id] >= self._max_per_tenant:
            raise Problem(
                429,
                "too-many-streams",
                "Too many open streams",
                f"this tenant already has {self._max_per_tenant} open streams; close one",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        if self.open_streams >= self._max_streams:
            raise Problem(
                503,
                "too-many-streams",
                "Too many open streams",
                "the server is at its stream limit; retry later",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        self._open[tenant_id] += 1
        try:
            yield
        finally:
            self._open[tenant_id] -= 1
            if not self._open[tenant_id]:
                del self._open[tenant_id]
