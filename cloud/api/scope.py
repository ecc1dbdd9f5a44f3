"""Whose data a request reads: the caller's own, or, for the admin, another tenant's
(`?tenant=NAME`) or every tenant's (`?tenant=*`).

A tenant naming itself is fine; naming another tenant is a 403 (`admin-only`), so a
tenant learns nothing of others, not even whether a name exists.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec
from aiohttp import web

from cloud.api.auth import tenant_of
from cloud.api.problems import Problem
from cloud.app_keys import STORE
from cloud.store import TenantRecord

ALL_TENANTS: Final = "*"
TenantParameter = (
    Annotated[
        str,
        msgspec.Meta(
            max_length=64,
            description="The admin: this tenant's (by name), or * for every tenant's.",
        ),
    ]
    | None
)


def tenant_not_found(name: str) -> Problem:
    return Problem(404, "tenant-not-found", "Tenant not found", f"no tenant {name[:100]!r}")


async def scoped_tenant(
    request: web.Request, named: str | None, *, admin_sees_all: bool
) -> TenantRecord | None:
    """The tenant whose data to read; None: every tenant's. Without `named`, the caller's
    own, or every tenant's for the admin when `admin_sees_all`."""
    caller = tenant_of(request)
    if named is None:
        return None if caller.admin and admin_sees_all else caller
    if named == caller.name:
        return caller
    if not caller.admin:
        raise Problem(
            403,
            "admin-only",
            "Forbidden",
            "only the admin reads another tenant's, or every tenant's",
        )
    if named == ALL_TENANTS:
        return None
    found = await request.app[STORE].get_tenant_by_name(named)
    if found is None:
        raise tenant_not_found(named)
    return found


async def tenant_names(request: web.Request, scope: TenantRecord | None) -> dict[str, str]:
    """Tenant id -> name for what `scope` covers (every tenant's for None)."""
    if scope is not None:
        return {scope.tenant_id: scope.name}
    return {t.tenant_id: t.name for t in await request.app[STORE].list_tenants()}
