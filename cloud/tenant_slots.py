"""Slots held for long work, bounded overall and per tenant (open streams, model
uploads being received or checked): one tenant's burst waits for its own slots and
cannot take every slot from the others.

The per-tenant bound alone still lets a few tenants hold every slot between them (two
tenants at 2 uploads each fill all 4), and every other tenant is refused until one of
them finishes. So a tenant that holds a slot never takes the last free one: that one is
kept for a tenant holding none, and every slot is held only when each holder has one.
"""

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
        True when the tenant holds its share (or would take the last free slot while
        holding one), False when every slot is held."""
        mine = self._held[tenant_id]
        if mine >= self.most_per_tenant or (mine and self.held + 1 >= self.most):
            raise refused(True)
        if self.held >= self.most:
            raise refused(False)
        self._held[tenant_id] = mine + 1
        try:
            yield
        finally:
            self._held[tenant_id] -= 1
            if not self._held[tenant_id]:
                del self._held[tenant_id]
