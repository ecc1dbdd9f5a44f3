"""Clusters with schedulers of their own as places to run (docs/backends.md): an admin
registers a Slurm cluster (`POST /v1/clusters`, audited `cluster.add`), lists them with
how each is doing, and removes one (`DELETE /v1/clusters/{name}`, audited
`cluster.remove`; refused while greenfed's jobs run or wait in its queue there). A
registered cluster's
machines are nodes `<cluster>.<machine>` in `GET /v1/nodes` at once."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Final

import msgspec
from aiohttp import web

from cloud.api.audit import audit_entry
from cloud.api.auth import tenant_of
from cloud.api.bodies import json_response, read_json
from cloud.api.problems import Problem, problem_reply
from cloud.api.routes import Reply, Route
from cloud.app_keys import CLUSTERS, SECRETS_AT_REST, STORE
from cloud.clusters.credentials import sealed
from cloud.clusters.views import MAX_CLUSTERS, ClusterList, ClusterSpec, ClusterView
from cloud.store.clusters import ClusterRecord, TooManyClustersError
from cloud.store.errors import ClusterExistsError, ClusterNotFoundError

_SPEC_DECODER: Final = msgspec.json.Decoder(ClusterSpec)
# How many of the jobs that keep a cluster from being removed its refusal names.
_JOBS_NAMED: Final = 10


def _not_found(name: str) -> Problem:
    return Problem(404, "cluster-not-found", "Cluster not found", f"no cluster {name!r}")


async def add_cluster(request: web.Request) -> web.Response:
    spec = await read_json(request, _SPEC_DECODER)
    store = request.app[STORE]
    record = ClusterRecord(
        spec=sealed(spec, request.app[SECRETS_AT_REST]),
        created_at=time.time(),
        created_by=tenant_of(request).tenant_id,
    )
    try:
        await store.add_cluster(
            record,
            audit=audit_entry(
                request,
                "cluster.add",
                spec.name,
                kind=spec.kind,
                zone=spec.zone,
                region=spec.region,
            ),
            max_clusters=MAX_CLUSTERS,  # counted where it is added: a burst keeps to it
        )
    except TooManyClustersError as error:
        raise Problem(
            409, "too-many-clusters", "Too many clusters", f"at most {error.max_clusters} clusters"
        ) from None
    except ClusterExistsError:
        raise Problem(
            409,
            "cluster-exists",
            "Cluster exists",
            f"a cluster named {spec.name!r} is registered already: remove it first",
        ) from None
    fleet = request.app[CLUSTERS]
    await fleet.adopt(await store.list_clusters())
    return json_response(fleet.view(record), status=201)


async def list_clusters(request: web.Request) -> web.Response:
    fleet = request.app[CLUSTERS]
    views = tuple(fleet.view(record) for record in await request.app[STORE].list_clusters())
    return json_response(ClusterList(items=views, count=len(views)))


async def _record(request: web.Request, name: str) -> ClusterRecord:
    for record in await request.app[STORE].list_clusters():
        if record.spec.name == name:
            return record
    raise _not_found(name)


async def get_cluster(request: web.Request) -> web.Response:
    record = await _record(request, request.match_info["name"])
    return json_response(request.app[CLUSTERS].view(record))


def _refuse_while_busy(name: str, live: Mapping[tuple[str, int], str]) -> None:
    """409 while greenfed's jobs run there, wait in its queue or are being submitted:
    removed, the cluster would still run a waiting one later, orphaned, while greenfed
    placed it again elsewhere."""
    if not live:
        return
    running = sum(state == "running" for state in live.values())
    job_ids = sorted({job_id for job_id, _ in live})
    named = ", ".join(job_ids[:_JOBS_NAMED]) + (", ..." if len(job_ids) > _JOBS_NAMED else "")
    raise Problem(
        409,
        "cluster-busy",
        "Cluster busy",
        f"{len(live)} of greenfed's jobs are on cluster {name!r} ({running} running, "
        f"{len(live) - running} waiting in its queue or being submitted): {named}; "
        "cancel them first",
    )


async def remove_cluster(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    store = request.app[STORE]
    fleet = request.app[CLUSTERS]
    # A registration today's rules refuse is listed nowhere (cloud/store/clusters.py) but
    # is still removed here, as the log that names it says to: only the store knows it.
    listed = {record.spec.name: record.spec for record in await store.list_clusters()}
    spec = listed.get(name)
    where = {} if spec is None else {"kind": spec.kind, "zone": spec.zone, "region": spec.region}
    bridge = fleet.bridge(name)
    # Nothing new starts there from here on: what is live now is all there can be.
    if bridge is not None:
        bridge.hold_submissions(True)
    removed = False
    try:
        _refuse_while_busy(name, bridge.live_jobs() if bridge is not None else {})
        record = await store.remove_cluster(
            name, audit=audit_entry(request, "cluster.remove", name, **where)
        )
        removed = True
    except ClusterNotFoundError:
        raise _not_found(name) from None
    finally:
        if bridge is not None and not removed:
            bridge.hold_submissions(False)
    await fleet.adopt(await store.list_clusters())
    return json_response(fleet.view(record))


ROUTES: Final = (
    Route(
        "POST",
        "/v1/clusters",
        add_cluster,
        "Register a cluster with a scheduler of its own (admin): Slurm",
        "admin",
        "clusters",
        body=ClusterSpec,
        replies=(
            Reply(201, "The cluster, its machines nodes from now on", ClusterView),
            problem_reply(409, "A cluster of that name exists, or too many do"),
        ),
    ),
    Route(
        "GET",
        "/v1/clusters",
        list_clusters,
        "List the registered clusters and how each is doing (admin)",
        "admin",
        "clusters",
        replies=(Reply(200, "Every cluster, by name", ClusterList),),
    ),
    Route(
        "GET",
        "/v1/clusters/{name}",
        get_cluster,
        "One registered cluster and how it is doing (admin)",
        "admin",
        "clusters",
        replies=(Reply(200, "The cluster", ClusterView), problem_reply(404, "No such cluster")),
    ),
    Route(
        "DELETE",
        "/v1/clusters/{name}",
        remove_cluster,
        "Remove a cluster (admin): its nodes leave the registry",
        "admin",
        "clusters",
        replies=(
            Reply(200, "The removed cluster", ClusterView),
            problem_reply(404, "No such cluster"),
            problem_reply(409, "greenfed's jobs run or wait in its queue there"),
        ),
    ),
)
