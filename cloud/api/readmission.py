"""Re-admitting nodes in bulk after the store was lost without a backup (issue 25):
`GET /v1/nodes/unenrolled` lists the nodes refused as not enrolled whose births prove
what this control plane once certified they enrolled as (cloud/fleet/unenrolled.py),
and `POST /v1/nodes/readmit` (admin, audited `node.readmit`) enrols them again as that:
the same node id, sealing key, envelope and broker username. Their agents keep their
credentials and their connection: nothing on the device changes.

A node id the store knows is never re-admitted this way: an enrolled one needs nothing,
and a revoked one stays revoked whatever certificate it shows (enrol it again with a
join token).
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec
import structlog
from aiohttp import web

from cloud.api.audit import audit_entry
from cloud.api.bodies import json_response, read_json
from cloud.api.enrolment import ENROLMENT_STATE, enrolled_node_view, ingest_knocking_births
from cloud.api.routes import Reply, Route
from cloud.app_keys import ENROLLED_NODES, INGESTOR, REGISTRY, STORE
from cloud.fleet.enrolment_views import (
    ReadmitRefusal,
    ReadmitRequest,
    ReadmitResult,
    UnenrolledNodeList,
    UnenrolledNodeView,
    sealing_key_fingerprint,
)
from cloud.fleet.unenrolled import KnockingNode
from cloud.store.enrolment import EnrolledNodeRecord
from shared.clock import utc_from_epoch

_READMIT_DECODER: Final = msgspec.json.Decoder(ReadmitRequest)
# ReadmitRequest's own rule (`node_ids` or `all`, never both, never neither) for the
# OpenAPI document.
READMIT_BODY_RULE: Final = {
    "anyOf": [
        {
            "required": ["node_ids"],
            "properties": {"node_ids": {"minItems": 1}, "all": {"const": False}},
        },
        {"required": ["all"], "properties": {"all": {"const": True}, "node_ids": {"maxItems": 0}}},
    ]
}
_log = structlog.get_logger("greenfed.enrolment")


def _state_of(app: web.Application, node_id: str) -> str:
    enrolled = app[ENROLLED_NODES]
    if not enrolled.admits(node_id):
        return "revoked" if enrolled.is_revoked(node_id) else "unenrolled"
    return "enrolled"


def _view(app: web.Application, node: KnockingNode) -> UnenrolledNodeView:
    certificate = node.certificate
    return UnenrolledNodeView(
        node_id=certificate.node_id,
        state=_state_of(app, certificate.node_id),
        enrolled_at=utc_from_epoch(certificate.enrolled_at),
        cluster_id=certificate.cluster_id,
        join_token_id=certificate.join_token_id,
        sealing_key_fingerprint=sealing_key_fingerprint(certificate.sealing_public_key),
        envelope=certificate.envelope,
        site=node.status.site,
        zone=node.status.zone,
        region=node.status.region,
        instance_id=node.status.instance_id,
        first_seen_at=utc_from_epoch(node.first_seen_s),
        last_seen_at=utc_from_epoch(node.last_seen_s),
    )


async def list_unenrolled(request: web.Request) -> web.Response:
    app = request.app
    views = tuple(_view(app, node) for node in app[ENROLMENT_STATE].unenrolled.listing())
    return json_response(UnenrolledNodeList(items=views, count=len(views)))


def _record(node: KnockingNode) -> EnrolledNodeRecord:
    certificate = node.certificate
    return EnrolledNodeRecord(
        node_id=certificate.node_id,
        enrolled_at=certificate.enrolled_at,
        join_token_id=certificate.join_token_id,
        revoked_at=None,
        username=certificate.username,
        sealing_public_key=certificate.sealing_public_key,
        envelope=certificate.envelope,
    )


async def readmit(request: web.Request) -> web.Response:
    app = request.app
    body = await read_json(request, _READMIT_DECODER)
    unenrolled = app[ENROLMENT_STATE].unenrolled
    refused: list[ReadmitRefusal] = []
    candidates: list[KnockingNode] = []
    wanted = (
        [node.status.node_id for node in unenrolled.listing()]
        if body.all
        else list(dict.fromkeys(body.node_ids))
    )
    for node_id in wanted:
        node = unenrolled.get(node_id)
        state = _state_of(app, node_id)
        if state != "unenrolled":
            if not body.all:
                refused.append(_refusal(node_id, state))
        elif node is None:
            refused.append(
                ReadmitRefusal(
                    node_id=node_id,
                    reason="not-knocking",
                    detail="no birth proving an enrolment certificate of this control plane "
                    "was seen from it: is its agent running, and was it enrolled with a "
                    "sealing key? Else enrol it again with a join token",
                )
            )
        else:
            candidates.append(node)
    readmitted = await app[STORE].readmit_nodes(
        [_record(node) for node in candidates],
        lambda record: audit_entry(
            request,
            "node.readmit",
            record.node_id,
            sealing_key=sealing_key_fingerprint(record.sealing_public_key or ""),
        ),
    )
    admitted = {record.node_id for record in readmitted}
    refused += [
        _refusal(node.status.node_id, "enrolled")
        for node in candidates
        if node.status.node_id not in admitted
    ]
    enrolled = app[ENROLLED_NODES]
    for record in readmitted:
        enrolled.enrolled(record.node_id, record.sealing_public_key, record.envelope)
    app[REGISTRY].judge_again(admitted)
    ingest_knocking_births(app, sorted(admitted))
    app[INGESTOR].notify_change()
    if readmitted:
        _log.info("nodes re-admitted", count=len(readmitted), node_ids=sorted(admitted)[:50])
    return json_response(
        ReadmitResult(
            readmitted=tuple(enrolled_node_view(record) for record in readmitted),
            refused=tuple(refused),
        )
    )


def _refusal(node_id: str, state: str) -> ReadmitRefusal:
    if state == "revoked":
        detail = (
            "an admin revoked it, and that stands whatever certificate it shows: enrol it "
            "again with a join token"
        )
    else:
        detail = "it is enrolled already"
    return ReadmitRefusal(node_id=node_id, reason=state, detail=detail)


ROUTES: Final = (
    Route(
        "GET",
        "/v1/nodes/unenrolled",
        list_unenrolled,
        "List nodes refused as not enrolled that prove an enrolment of this control plane",
        "admin",
        "enrolment",
        description=(
            "After the store was lost without a backup: each node whose birth shows an "
            "enrolment certificate signed by this control plane's key, with a proof that "
            "it holds the sealing key the certificate names. Kept by each replica from the "
            "births it ingests."
        ),
        replies=(Reply(200, "Every such node, by node id", UnenrolledNodeList),),
    ),
    Route(
        "POST",
        "/v1/nodes/readmit",
        readmit,
        "Enrol nodes again as their certificates say they enrolled (admin)",
        "admin",
        "enrolment",
        body=Annotated[ReadmitRequest, msgspec.Meta(extra_json_schema=READMIT_BODY_RULE)],
        description=(
            "Each named node (or, with `all`, each unenrolled node listed by GET "
            "/v1/nodes/unenrolled) is enrolled again with the node id, sealing key, "
            "envelope and broker username its certificate names, audited as node.readmit. "
            "Its agent keeps running and is admitted at once. Nodes the store knows "
            "(enrolled, or revoked) are refused, saying why."
        ),
        replies=(Reply(200, "Who was re-admitted, who was not and why", ReadmitResult),),
    ),
)
