"""`/v1/nodes`: the fleet as the cloud sees it."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Final

import msgspec
from aiohttp import web

from cloud.api.audit import audit_entry
from cloud.api.auth import tenant_of
from cloud.api.bodies import PatchFields, decode_body, invalid_body, json_response, read_body
from cloud.api.bulk_actions import destructive
from cloud.api.problems import Problem
from cloud.api.query import parse_query
from cloud.api.routes import Reply, Route
from cloud.app_keys import DRAIN_WAITING, INGESTOR, NODE_PAGES, REGISTRY, SCHEDULER, STORE
from cloud.fleet.envelope import claim_of
from cloud.fleet.node_admin import apply_one
from cloud.fleet.registry import Approval, NodeFilter, NodeRecord
from cloud.fleet.views import NodeDetail, NodeList, node_detail
from cloud.fleet.well_known_labels import DERIVED_LABEL_KEYS, reserved_label_error
from cloud.store import KEEP, NewAudit, NodeAdminRecord
from cloud.store.node_admin import NodeAdminChanges
from shared.messages import AcceleratorKind, NodeState, Site
from shared.placement_names import (
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    MAX_LABEL_KEY_CHARS,
    MAX_LABEL_VALUE_CHARS,
    label_error,
)
from shared.taints import MAX_TAINTS, TAINT_EFFECTS, parse_taint

MAX_PAGE_SIZE = 10_000


class NodeListQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    site: Site | None = None
    zone: str | None = None
    region: str | None = None
    kind: AcceleratorKind | None = None
    state: NodeState | None = None
    approval: Approval | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_PAGE_SIZE)] = 1000
    cursor: str | None = None


async def list_nodes(request: web.Request) -> web.Response:
    query = parse_query(request, NodeListQuery)
    node_filter = NodeFilter(
        site=query.site,
        zone=query.zone,
        region=query.region,
        kind=query.kind,
        state=query.state,
        approval=query.approval,
    )
    # Each node's JSON is kept and the fleet's order too (cloud/fleet/node_pages.py).
    body = request.app[NODE_PAGES].page(
        node_filter, query.cursor, query.limit, lambda record: _drain_waiting(request, record)
    )
    return web.Response(body=body, content_type="application/json")


async def get_node(request: web.Request) -> web.Response:
    node_id = request.match_info["node_id"]
    record = request.app[REGISTRY].get(node_id)
    if record is None:
        raise Problem(404, "node-not-found", "Node not found", f"no node {node_id!r}")
    detail = node_detail(record, _drain_waiting(request, record))
    if not tenant_of(request).admin and detail.telemetry is not None:
        # Its replicas' serving figures are their tenants' (as on /metrics, where only
        # the admin and the scrape token see them), not every tenant's.
        telemetry = msgspec.structs.replace(detail.telemetry, deployments=())
        detail = msgspec.structs.replace(detail, telemetry=telemetry)
    return json_response(detail)


DRAIN_WAITING_FOR_TENANTS: Final = (
    "waiting: deployments on this node keep their disruption budgets or start their "
    "replacements first (the admin sees which)"
)


def _drain_waiting(request: web.Request, record: NodeRecord) -> tuple[str, ...]:
    """What the node's drain waits for: as this process's latest pass found where it
    leads the scheduling, else as the leader stored it."""
    if record.admin is None or not record.admin.draining:
        return ()
    if SCHEDULER in request.app and request.app[SCHEDULER].leading.is_set():
        waiting = request.app[SCHEDULER].deployments.drain_waiting.get(record.node_id, ())
    else:
        waiting = request.app[DRAIN_WAITING].by_node.get(record.node_id, ())
    if waiting and not tenant_of(request).admin:
        # Each names a deployment and its budget: its tenant's, not every tenant's (as
        # the node's serving figures are). A drain is the admin's to follow.
        return (DRAIN_WAITING_FOR_TENANTS,)
    return waiting


# `key[=value][:Effect]` as an admin writes it here: shared.taints' grammar (whose keys
# and lengths it repeats), with a value of printable ASCII and no spaces around.
ADMIN_TAINT_PATTERN: Final = (
    "^[A-Za-z0-9]([A-Za-z0-9._/-]{0,251}[A-Za-z0-9])?(=[!-9;<>-~]{0,253})?"
    f"(:({'|'.join(TAINT_EFFECTS)}))?$(?!\\n)"
)
_ADMIN_TAINT: Final = re.compile(ADMIN_TAINT_PATTERN)


class NodeAdminUpdate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What an admin sets on a node, beside what its agent declares (each replaces the
    admin's previous list or map; absent: unchanged)."""

    taints: (
        Annotated[
            tuple[
                Annotated[
                    str,
                    msgspec.Meta(
                        min_length=1,
                        max_length=600,
                        extra_json_schema={"pattern": ADMIN_TAINT_PATTERN},
                    ),
                ],
                ...,
            ],
            msgspec.Meta(max_length=MAX_TAINTS, description="`key=value:Effect` each."),
        ]
        | None
    ) = None
    labels: (
        Annotated[
            dict[
                Annotated[
                    str,
                    msgspec.Meta(
                        min_length=1,
                        max_length=MAX_LABEL_KEY_CHARS,
                        # The grammar every label key follows, less those the node's
                        # enrolment and birth give (checked by `label_error` and
                        # `reserved_label_error`, whose messages say why).
                        extra_json_schema={
                            "pattern": LABEL_KEY_PATTERN,
                            "not": {"enum": list(DERIVED_LABEL_KEYS)},
                        },
                    ),
                ],
                Annotated[
                    str,
                    msgspec.Meta(
                        max_length=MAX_LABEL_VALUE_CHARS,
                        extra_json_schema={"pattern": LABEL_VALUE_PATTERN},
                    ),
                ],
            ],
            msgspec.Meta(max_length=64),
        ]
        | None
    ) = None


_ADMIN_UPDATE = msgspec.json.Decoder(NodeAdminUpdate)
_NODE_CHANGES: Final = PatchFields(not_null=("taints", "labels"))


def _known(request: web.Request) -> str:
    node_id = request.match_info["node_id"]
    if request.app[REGISTRY].get(node_id) is None:
        raise Problem(404, "node-not-found", "Node not found", f"no node {node_id[:128]!r}")
    return node_id


async def _store_admin(
    request: web.Request,
    node_id: str,
    changes: NodeAdminChanges,
    audit: Callable[[NodeAdminRecord], NewAudit],
) -> web.Response:
    """Apply `changes` to the node's settings as stored now (another admin's change a
    moment ago is kept: never the registry's copy written back whole), audited as
    `audit` makes the entry from the record as stored."""
    stored = await request.app[STORE].change_node_admin(node_id, changes, audit=audit)
    registry = request.app[REGISTRY]
    held = registry.admin.get(node_id)
    # Concurrent changes may answer out of commit order: the newer record stays.
    if (held is None or held.updated_at <= stored.updated_at) and apply_one(registry, stored):
        request.app[INGESTOR].notify_change()  # the next pass sees it now
    found = registry.get(node_id)
    assert found is not None
    return json_response(node_detail(found, _drain_waiting(request, found)))


def _audited(audit: NewAudit) -> Callable[[NodeAdminRecord], NewAudit]:
    """An entry whose detail does not depend on the record as stored."""
    return lambda _stored: audit


async def cordon_node(request: web.Request) -> web.Response:
    node_id = _known(request)
    audit = audit_entry(request, "node.cordon", node_id)
    return await _store_admin(request, node_id, NodeAdminChanges(cordoned=True), _audited(audit))


async def uncordon_node(request: web.Request) -> web.Response:
    node_id = _known(request)
    audit = audit_entry(request, "node.uncordon", node_id)
    changes = NodeAdminChanges(cordoned=False, draining=False)
    return await _store_admin(request, node_id, changes, _audited(audit))


@destructive("node.drain")
async def drain_node(request: web.Request) -> web.Response:
    node_id = _known(request)
    audit = audit_entry(request, "node.drain", node_id)  # past the bulk limit: stops here
    changes = NodeAdminChanges(cordoned=True, draining=True)
    return await _store_admin(request, node_id, changes, _audited(audit))


class NodeApproval(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What an admin approves: the node as its latest birth says it is."""

    trust_figures: Annotated[
        bool,
        msgspec.Meta(
            description=(
                "Take the node's own speed and power figures instead of the model table's "
                "(a model the table does not know, a board the table's figures misjudge)."
            )
        ),
    ] = False


_APPROVAL = msgspec.json.Decoder(NodeApproval)


async def approve_node(request: web.Request) -> web.Response:
    """Approve the node as its latest birth says it is: that is what it is held to from
    now on (cloud/fleet/envelope.py), and it takes work again."""
    node_id = _known(request)
    # The body is optional: without one, the model table's figures stay.
    body = (
        decode_body(await read_body(request), _APPROVAL)
        if request.can_read_body
        else NodeApproval()
    )
    found = request.app[REGISTRY].get(node_id)
    assert found is not None
    claim = msgspec.structs.replace(claim_of(found.status), by_admin=True)
    audit = audit_entry(
        request,
        "node.approve",
        node_id,
        differences=list(found.awaiting_approval),
        approved=msgspec.to_builtins(claim),
        trust_figures=body.trust_figures,
    )
    changes = NodeAdminChanges(approved=claim, trust_figures=body.trust_figures)
    return await _store_admin(request, node_id, changes, _audited(audit))


async def update_node(request: web.Request) -> web.Response:
    node_id = _known(request)
    body = decode_body(await read_body(request), _ADMIN_UPDATE)
    _NODE_CHANGES.check(body)
    if body.taints is not None:
        for number, text in enumerate(body.taints):
            try:
                parse_taint(text)
            except ValueError as error:
                raise invalid_body(f"$.taints[{number}]", str(error)) from None
            if _ADMIN_TAINT.fullmatch(text) is None:
                raise invalid_body(
                    f"$.taints[{number}]",
                    f"taint {text[:100]!r}: key=value:Effect, the value printable ASCII "
                    "without spaces, nothing around it",
                )
    if body.labels is not None:
        for key in body.labels:
            if (reserved := reserved_label_error(key)) is not None:
                raise invalid_body(f"$.labels.{key}", reserved)
        # The grammar every other part holds labels to (agent, enrolment, births): what
        # an admin sets is shown to every tenant and exported, as a node's own labels are.
        if (fault := label_error(body.labels)) is not None:
            raise invalid_body(*fault)
    changes = NodeAdminChanges(
        taints=KEEP if body.taints is None else body.taints,
        labels=KEEP if body.labels is None else body.labels,
    )

    def audit(stored: NodeAdminRecord) -> NewAudit:
        # As stored: a list or map this PATCH left out may have changed a moment ago.
        taints, labels = list(stored.taints), dict(stored.labels)
        return audit_entry(request, "node.update", node_id, taints=taints, labels=labels)

    return await _store_admin(request, node_id, changes, audit)


_ADMIN_REPLIES = (Reply(200, "The node, with what the admin set", NodeDetail),)

ROUTES = (
    Route(
        "GET",
        "/v1/nodes",
        list_nodes,
        "The fleet, sorted by node id",
        "tenant",
        "nodes",
        query=NodeListQuery,
        replies=(Reply(200, "A page of nodes", NodeList),),
    ),
    Route(
        "GET",
        "/v1/nodes/{node_id}",
        get_node,
        "One node with its host and latest telemetry",
        "tenant",
        "nodes",
        replies=(Reply(200, "The node", NodeDetail),),
    ),
    Route(
        "POST",
        "/v1/nodes/{node_id}/cordon",
        cordon_node,
        "Cordon a node: no new work lands there; what runs stays",
        "admin",
        "nodes",
        replies=_ADMIN_REPLIES,
    ),
    Route(
        "POST",
        "/v1/nodes/{node_id}/uncordon",
        uncordon_node,
        "Uncordon a node: it takes new work again",
        "admin",
        "nodes",
        replies=_ADMIN_REPLIES,
    ),
    Route(
        "POST",
        "/v1/nodes/{node_id}/drain",
        drain_node,
        "Drain a node: cordon it and move its work elsewhere",
        "admin",
        "nodes",
        description=(
            "Training is requeued (a checkpointing job resumes from its checkpoint); an "
            "inference replica is started elsewhere first and stops once the new one "
            "serves. Uncordon ends the drain."
        ),
        replies=_ADMIN_REPLIES,
    ),
    Route(
        "POST",
        "/v1/nodes/{node_id}/approve",
        approve_node,
        "Approve a node as its latest birth says it is (kubelet-style approval)",
        "admin",
        "nodes",
        body=NodeApproval,
        body_required=False,
        description=(
            "A node whose birth says more than it enrolled (or was approved) as is "
            "`pending-approval`: it takes no new work and receives no secrets. Approving "
            "makes what it says now the claim it is held to; the differences are audited."
        ),
        replies=_ADMIN_REPLIES,
    ),
    Route(
        "PATCH",
        "/v1/nodes/{node_id}",
        update_node,
        "Set a node's admin taints and labels, beside its agent's",
        "admin",
        "nodes",
        body=Annotated[
            NodeAdminUpdate, msgspec.Meta(extra_json_schema=_NODE_CHANGES.json_schema())
        ],
        replies=_ADMIN_REPLIES,
    ),
)
