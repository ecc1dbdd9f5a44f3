"""Bounds on long-lived responses (SSE, followed logs): a slot per stream, per tenant."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

from cloud.api.problems import Problem


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
        """Hold a stream slot for the block, or raise a 503 problem when none is free."""
        if self._open[tenant_id] >= self._max_per_tenant:
            raise Problem(
                429,
                "too-many-streams",
                "Too many open streams",
                f"this tenant already has {self._max_per_tenant} open streams; close one",
                headers={"Retry-After": "5"},
            )
        if self.open_streams >= self._max_streams:
            raise Problem(
                503,
                "too-many-streams",
                "Too many open streams",
                "the server is at its stream limit; retry later",
                headers={"Retry-After": "5"},
            )
        self._open[tenant_id] += 1
        try:
            yield
        finally:
            self._open[tenant_id] -= 1
            if not self._open[tenant_id]:
                del self._open[tenant_id]
