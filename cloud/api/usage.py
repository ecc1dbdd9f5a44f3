"""`/v1/usage`: energy, emissions, cost and emissions avoided over a period, grouped by
tenant, zone, job or day, as JSON or CSV (what Slurm's `sacct` is to charge-back).

A tenant sees its own usage; the admin sees every tenant's (or one, `?tenant=`).
Periods are whole UTC hours: a row counts when its hour starts within [from, to).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec
from aiohttp import web

from cloud.api.auth import tenant_of
from cloud.api.bodies import json_response
from cloud.api.problems import Problem, invalid_query
from cloud.api.query import comma_list, comma_list_pattern, parse_query
from cloud.api.routes import Reply, Route
from cloud.app_keys import STORE
from cloud.store import UsageQuery
from cloud.usage.views import USAGE_GROUPS, UsageGroup, UsageReport, usage_csv, usage_report
from shared.problems import InvalidParam

CSV = "text/csv"


# A time with its offset, e.g. 2026-12-01T00:00:00Z.
_Time = Annotated[datetime, msgspec.Meta(tz=True)]


class UsageParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    from_: _Time | None = msgspec.field(default=None, name="from")
    to: _Time | None = None
    # Comma-separated, in any order (a group named twice counts once).
    group_by: Annotated[
        str, msgspec.Meta(extra_json_schema={"pattern": comma_list_pattern(USAGE_GROUPS)})
    ] = "tenant"
    tenant: str | None = None  # the admin: one tenant's usage (by name)
    format: Literal["json", "csv"] = "json"


def _groups(text: str) -> tuple[UsageGroup, ...]:
    names = comma_list("group_by", text, USAGE_GROUPS)
    return tuple(g for g in USAGE_GROUPS if g in names)


def _epoch(at: datetime | None) -> float | None:
    return None if at is None else at.timestamp()


async def get_usage(request: web.Request) -> web.StreamResponse:
    params = parse_query(request, UsageParams)
    groups = _groups(params.group_by)
    from_s, until_s = _epoch(params.from_), _epoch(params.to)
    if from_s is not None and until_s is not None and until_s <= from_s:
        raise invalid_query(InvalidParam("to", "must be after from"))
    tenant = tenant_of(request)
    store = request.app[STORE]
    tenant_id: str | None = tenant.tenant_id
    if tenant.admin:
        tenant_id = None
        if params.tenant is not None:
            named = await store.get_tenant_by_name(params.tenant)
            if named is None:
                raise Problem(
                    404,
                    "tenant-not-found",
                    "Tenant not found",
                    f"no tenant {params.tenant[:100]!r}",
                )
            tenant_id = named.tenant_id
    elif params.tenant is not None and params.tenant != tenant.name:
        raise Problem(403, "admin-only", "Forbidden", "only the admin sees another tenant's usage")
    rows = await store.usage(UsageQuery(tenant_id=tenant_id, from_s=from_s, until_s=until_s))
    names = (
        {t.tenant_id: t.name for t in await store.list_tenants()}
        if tenant.admin
        else {tenant.tenant_id: tenant.name}
    )
    report = usage_report(
        rows,
        groups,
        names,
        from_=params.from_.isoformat() if params.from_ else None,
        until=params.to.isoformat() if params.to else None,
    )
    if params.format == "csv" or CSV in request.headers.get("Accept", ""):
        return web.Response(text=usage_csv(report), content_type=CSV, charset="utf-8")
    return json_response(report)


ROUTES = (
    Route(
        "GET",
        "/v1/usage",
        get_usage,
        "Energy, emissions, cost and emissions avoided, grouped (like sacct)",
        "tenant",
        "usage",
        query=UsageParams,
        replies=(
            Reply(200, "The groups and their totals per currency", UsageReport),
            Reply(200, "The same as CSV (format=csv or Accept: text/csv)", content_type=CSV),
        ),
        description=(
            "A tenant sees its own usage, the admin every tenant's. Rows are hourly: one "
            "counts when its UTC hour starts within [from, to)."
        ),
    ),
)
