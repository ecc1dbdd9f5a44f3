"""`/v1/tenants` (admin): tenants with their quotas, caps on running and queued work,
cohort, borrowing limits and the priority classes they may submit; creating one returns
its first bearer token, once; `PATCH` changes a tenant, for the scheduler's next pass.
Both are in the audit log."""

from __future__ import annotations

from typing import Annotated, Final

import msgspec
from aiohttp import web

from cloud.api.audit import audit_entry
from cloud.api.bodies import PatchFields, invalid_body, json_response, read_json
from cloud.api.credential_minting import ADMIN_MINTING_REFUSAL, refuse_unless_caller_active
from cloud.api.fair_share import fair_share_views
from cloud.api.problems import Problem, problem_reply
from cloud.api.routes import Reply, Route
from cloud.api.scope import tenant_not_found
from cloud.app_keys import STORE
from cloud.store import (
    KEEP,
    NewAudit,
    NewTenant,
    TenantChanges,
    TenantExistsError,
    TenantNotFoundError,
    TenantRecord,
)
from cloud.store.ids import is_valid_id
from cloud.work.views import (
    TenantCreate,
    TenantCreated,
    TenantList,
    TenantUpdate,
    TenantView,
    tenant_fields,
    tenant_view,
)

# What only an active token may do here (cloud/api/credential_minting.py), as refused.
_CREATING_TENANTS: Final = "create tenants (each comes with its own token)"
_CREATE_DECODER: Final = msgspec.json.Decoder(TenantCreate)
_UPDATE_DECODER: Final = msgspec.json.Decoder(TenantUpdate)
# Every field may be given as null (removing a cohort or a cap): any one given is a change.
_TENANT_CHANGES: Final = PatchFields(
    present=tuple(field.encode_name for field in msgspec.structs.fields(TenantUpdate))
)


async def create_tenant(request: web.Request) -> web.Response:
    # A tenant comes with a bearer token (an admin's, perhaps): a credential.
    await refuse_unless_caller_active(request, _CREATING_TENANTS)
    body = await read_json(request, _CREATE_DECODER)
    new = NewTenant(
        name=body.name,
        quotas=body.quotas,
        borrowing_limit=body.borrowing_limit,
        cohort=body.cohort,
        allowed_priorities=tuple(dict.fromkeys(body.allowed_priorities)),
        admin=body.admin,
        max_running=body.max_running,
        max_queued=body.max_queued,
        lending_limit=body.lending_limit,
    )
    audit = audit_entry(
        request, "tenant.create", body.name, **tenant_fields_of(new), admin=body.admin
    )
    try:
        created = await request.app[STORE].create_tenant(new, audit=audit)
    except TenantExistsError:
        raise Problem(
            409, "tenant-exists", "Tenant exists", f"a tenant named {body.name!r} already exists"
        ) from None
    except ValueError as error:
        raise invalid_body("$", str(error)) from None
    reply = TenantCreated(**tenant_fields(created.tenant), token=created.token)  # type: ignore[arg-type]
    return json_response(reply, status=201)


def tenant_fields_of(tenant: NewTenant | TenantRecord) -> dict[str, object]:
    return {
        "quotas": dict(tenant.quotas),
        "borrowing_limit": dict(tenant.borrowing_limit),
        "cohort": tenant.cohort,
        "allowed_priorities": list(tenant.allowed_priorities),
        "max_running": tenant.max_running,
        "max_queued": tenant.max_queued,
        "lending_limit": dict(tenant.lending_limit),
    }


async def _named(request: web.Request) -> TenantRecord:
    """The tenant of the path: `{tenant}` is its name or its id."""
    key = request.match_info["tenant"]
    store = request.app[STORE]
    found = await store.get_tenant_by_name(key)
    if found is None and is_valid_id(key):
        found = await store.get_tenant(key)
    if found is None:
        raise tenant_not_found(key)
    return found


async def update_tenant(request: web.Request) -> web.Response:
    body = await read_json(request, _UPDATE_DECODER)
    found = await _named(request)
    _TENANT_CHANGES.check(body)
    changes = TenantChanges(
        quotas=KEEP if body.quotas is msgspec.UNSET else body.quotas,
        borrowing_limit=KEEP if body.borrowing_limit is msgspec.UNSET else body.borrowing_limit,
        cohort=KEEP if body.cohort is msgspec.UNSET else body.cohort,
        allowed_priorities=(
            KEEP
            if body.allowed_priorities is msgspec.UNSET
            else tuple(dict.fromkeys(body.allowed_priorities))
        ),
        max_running=KEEP if body.max_running is msgspec.UNSET else body.max_running,
        max_queued=KEEP if body.max_queued is msgspec.UNSET else body.max_queued,
        lending_limit=KEEP if body.lending_limit is msgspec.UNSET else body.lending_limit,
    )

    def audit(before: TenantRecord, after: TenantRecord) -> NewAudit:
        # From the tenant as the store locked it, not as read above: a PATCH that
        # committed in between is this one's "from".
        old, new = tenant_fields_of(before), tenant_fields_of(after)
        changed = {
            name: {"from": old[name], "to": new[name]} for name in old if old[name] != new[name]
        }
        return audit_entry(request, "tenant.update", before.name, **changed)

    try:
        after = await request.app[STORE].update_tenant(found.tenant_id, changes, audit=audit)
    except TenantNotFoundError:
        raise tenant_not_found(found.name) from None
    except ValueError as error:
        raise invalid_body("$", str(error)) from None
    return json_response(tenant_view(after))


async def list_tenants(request: web.Request) -> web.Response:
    records = await request.app[STORE].list_tenants()
    shares = await fair_share_views(request.app, records)
    items = tuple(
        msgspec.structs.replace(tenant_view(r), fair_share=shares.get(r.name)) for r in records
    )
    body = TenantList(items=items, count=len(records))
    return json_response(body)


ROUTES: Final = (
    Route(
        "POST",
        "/v1/tenants",
        create_tenant,
        "Create a tenant (admin); the reply holds its token, shown only this once",
        "admin",
        "tenants",
        body=TenantCreate,
        replies=(
            Reply(201, "The tenant and its bearer token", TenantCreated),
            ADMIN_MINTING_REFUSAL,
            problem_reply(409, "A tenant of that name exists"),
        ),
    ),
    Route(
        "GET",
        "/v1/tenants",
        list_tenants,
        "List the tenants (admin)",
        "admin",
        "tenants",
        description=(
            "Each tenant carries `fair_share`: its cohort path, what it holds, its decayed "
            "past usage, its dominant share and its rank among its siblings "
            "(docs/scheduling.md, Queue order)."
        ),
        replies=(Reply(200, "Every tenant, by name", TenantList),),
    ),
    Route(
        "PATCH",
        "/v1/tenants/{tenant}",
        update_tenant,
        "Change a tenant's quotas, caps, cohort or priority classes (admin)",
        "admin",
        "tenants",
        body=Annotated[TenantUpdate, msgspec.Meta(extra_json_schema=_TENANT_CHANGES.json_schema())],
        description=(
            "`{tenant}` is its name or id. A field left out stays as it is; null removes a "
            "cohort or a cap. The scheduler applies the change from its next pass; work "
            "that runs is never evicted because a quota went down."
        ),
        replies=(Reply(200, "The tenant as it is now", TenantView),),
    ),
)
