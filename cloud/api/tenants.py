"""`/v1/tenants` (admin): tenants with their quotas, cohort, borrowing limits and the
priority classes they may submit; creating one returns its bearer token, once."""

from __future__ import annotations

from typing import Final

import msgspec
from aiohttp import web

from cloud.api.bodies import invalid_body, json_response, read_json
from cloud.api.problems import Problem, problem_reply
from cloud.api.routes import Reply, Route
from cloud.app_keys import STORE
from cloud.store import NewTenant, TenantExistsError
from cloud.work.views import (
    TenantCreate,
    TenantCreated,
    TenantList,
    tenant_fields,
    tenant_view,
)

_CREATE_DECODER: Final = msgspec.json.Decoder(TenantCreate)


async def create_tenant(request: web.Request) -> web.Response:
    body = await read_json(request, _CREATE_DECODER)
    try:
        created = await request.app[STORE].create_tenant(
            NewTenant(
                name=body.name,
                quotas=body.quotas,
                borrowing_limit=body.borrowing_limit,
                cohort=body.cohort,
                allowed_priorities=tuple(dict.fromkeys(body.allowed_priorities)),
                admin=body.admin,
            )
        )
    except TenantExistsError:
        raise Problem(
            409, "tenant-exists", "Tenant exists", f"a tenant named {body.name!r} already exists"
        ) from None
    except ValueError as error:
        raise invalid_body("$", str(error)) from None
    reply = TenantCreated(**tenant_fields(created.tenant), token=created.token)  # type: ignore[arg-type]
    return json_response(reply, status=201)


async def list_tenants(request: web.Request) -> web.Response:
    records = await request.app[STORE].list_tenants()
    body = TenantList(items=tuple(tenant_view(r) for r in records), count=len(records))
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
        replies=(Reply(200, "Every tenant, by name", TenantList),),
    ),
)
