"""`/v1/nodes`: the fleet as the cloud sees it."""

from __future__ import annotations

from typing import Annotated

import msgspec
from aiohttp import web

from cloud.api.bodies import json_response
from cloud.api.problems import Problem
from cloud.api.query import parse_query
from cloud.api.routes import Reply, Route
from cloud.app_keys import REGISTRY
from cloud.fleet.registry import NodeFilter
from cloud.fleet.views import NodeDetail, NodeList, node_detail, node_summary
from shared.messages import AcceleratorKind, NodeState, Site

MAX_PAGE_SIZE = 10_000


class NodeListQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    site: Site | None = None
    zone: str | None = None
    region: str | None = None
    kind: AcceleratorKind | None = None
    state: NodeState | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_PAGE_SIZE)] = 1000
    cursor: str | None = None


async def list_nodes(request: web.Request) -> web.Response:
    query = parse_query(request, NodeListQuery)
    records = request.app[REGISTRY].nodes(
        NodeFilter(
            site=query.site,
            zone=query.zone,
            region=query.region,
            kind=query.kind,
            state=query.state,
        )
    )
    total = len(records)
    if query.cursor is not None:
        # Ids are sorted, so "after the cursor" is stable while nodes come and go.
        records = [record for record in records if record.node_id > query.cursor]
    page = records[: query.limit]
    next_cursor = page[-1].node_id if len(records) > query.limit else None
    body = NodeList(
        items=tuple(node_summary(record) for record in page),
        count=len(page),
        total=total,
        next_cursor=next_cursor,
    )
    return json_response(body)


async def get_node(request: web.Request) -> web.Response:
    node_id = request.match_info["node_id"]
    record = request.app[REGISTRY].get(node_id)
    if record is None:
        raise Problem(404, "node-not-found", "Node not found", f"no node {node_id!r}")
    return json_response(node_detail(record))


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
)
