"""Slots held for long work, bounded overall and per tenant (open streams, model
uploads being received or checked): one tenant's burst waits for its own slots and
cannot take every slot from the others."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator


class TenantSlots:
    def __init__(self, *, most: int, most_per_tenant: int) -> None:
        self.most = most
        self.most_per_tenant = most_per_tenant
        self._held: Counter[str] = Counter()  # tenant id: slots held

    @property
    def held(self) -> int:
        return self._held.total()

    @contextlib.contextmanager
    def slot(self, tenant_id: str, refused: Callable[[bool], Exception]) -> Iterator[None]:
        """Hold a slot for the block; when none is free, raise `refused(per_tenant)`:
        True when the tenant holds its share, False when every slot is held."""
        if self._held[tenant_id] >= self.most_per_tenant:
            raise refused(True)
        if self.held >= self.most:
            raise refused(False)
        self._held[tenant_id] += 1
        try:
            yield
        finally:
            self._held[tenant_id] -= 1
            if not self._held[tenant_id]:
                del self._held[tenant_id]
