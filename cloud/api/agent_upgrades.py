"""Agent upgrades over the air (docs/operations.md "Upgrading agents"): an admin
publishes a greenfed wheel (`POST /v1/agent-packages`, audited `agent_package.publish`),
which the control plane checks and signs; starts a rollout of it
(`POST /v1/agent-rollouts`, audited `agent_rollout.create`), which the scheduling loop
drives in waves (cloud/upgrades/); watches it and cancels it
(`POST /v1/agent-rollouts/{id}/cancel`, audited `agent_rollout.cancel`). Agents fetch
the wheel at the signed URL their `desired` document gives."""

from __future__ import annotations

import time
from typing import Final

import msgspec
from aiohttp import web

from cloud.api.audit import audit_entry
from cloud.api.auth import tenant_of
from cloud.api.bodies import json_response, payload_too_large, read_json
from cloud.api.credential_minting import ADMIN_MINTING_REFUSAL, refuse_unless_caller_active
from cloud.api.problems import Problem, problem_reply
from cloud.api.routes import Reply, Route
from cloud.app_keys import MODEL_URL_SIGNER, REGISTRY, SIGNING_KEY, STORE
from cloud.store.agent_upgrades import AgentPackageRecord, AgentRolloutRecord
from cloud.store.errors import AgentPackageExistsError, AgentRolloutRunningError
from cloud.store.ids import IdGenerator
from cloud.upgrades.packages import package_record, package_view, verify_package_url
from cloud.upgrades.rollout import new_rollout, waves_of
from cloud.upgrades.views import (
    PackageList,
    PackageView,
    RolloutList,
    RolloutRequest,
    RolloutView,
)
from shared.agent_packages import MAX_PACKAGE_BYTES, PackageError, is_valid_version

_REQUEST_DECODER: Final = msgspec.json.Decoder(RolloutRequest)
_WHEEL_MEDIA_TYPES: Final = ("application/octet-stream", "application/zip")
_CHUNK_BYTES: Final = 1 << 16
_IDS: Final = IdGenerator()


def _package_not_found(version: str) -> Problem:
    return Problem(
        404,
        "agent-package-not-found",
        "Agent package not found",
        f"no agent version {version[:80]!r} is published: `greenfed agent-packages publish` it",
    )


def _rollout_not_found(rollout_id: str) -> Problem:
    return Problem(
        404, "agent-rollout-not-found", "Rollout not found", f"no rollout {rollout_id[:80]!r}"
    )


# Code every node runs as the agent outlives any overlap as a credential does, and more.
_PUBLISHING_AGENTS: Final = "publish or roll out agent versions"


async def publish_package(request: web.Request) -> web.Response:
    await refuse_unless_caller_active(request, _PUBLISHING_AGENTS)
    if request.content_type not in _WHEEL_MEDIA_TYPES:
        raise Problem(
            415,
            "unsupported-media-type",
            "Unsupported Media Type",
            f"send the .whl file as application/octet-stream, not {request.content_type}",
        )
    if request.content_length is not None and request.content_length > MAX_PACKAGE_BYTES:
        raise payload_too_large(
            f"the body has {request.content_length} bytes; at most {MAX_PACKAGE_BYTES}"
        )
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.content.iter_chunked(_CHUNK_BYTES):
        received += len(chunk)
        if received > MAX_PACKAGE_BYTES:
            raise payload_too_large(f"the body exceeds {MAX_PACKAGE_BYTES} bytes")
        chunks.append(chunk)
    content = b"".join(chunks)
    try:
        record = package_record(
            content, request.app[SIGNING_KEY], published_by=tenant_of(request).tenant_id
        )
    except PackageError as error:
        raise Problem(422, "not-an-agent-package", "Not an agent package", str(error)) from None
    try:
        await request.app[STORE].add_agent_package(
            record,
            content,
            audit=audit_entry(
                request,
                "agent_package.publish",
                record.version,
                sha256=record.sha256,
                size_bytes=record.size_bytes,
            ),
        )
    except AgentPackageExistsError:
        raise Problem(
            409,
            "agent-package-exists",
            "Agent package exists",
            f"agent version {record.version} is published already; a version never changes",
        ) from None
    return json_response(package_view(record), status=201)


async def list_packages(request: web.Request) -> web.Response:
    records = await request.app[STORE].list_agent_packages()
    return json_response(
        PackageList(items=tuple(package_view(r) for r in records), count=len(records))
    )


async def _package(request: web.Request) -> AgentPackageRecord:
    version = request.match_info["version"]
    record = await request.app[STORE].agent_package(version) if is_valid_version(version) else None
    if record is None:
        raise _package_not_found(version)
    return record


async def get_package(request: web.Request) -> web.Response:
    return json_response(package_view(await _package(request)))


async def get_package_wheel(request: web.Request) -> web.Response:
    """An agent's download: every refusal is the same 403, so an anonymous caller
    learns nothing of which versions exist (as a model's signed download)."""
    version = request.match_info["version"]
    store = request.app[STORE]
    record = await store.agent_package(version) if is_valid_version(version) else None
    signature = request.query.get("sig", "")
    if record is None or not verify_package_url(
        request.app[MODEL_URL_SIGNER], record.version, record.sha256, signature
    ):
        raise Problem(403, "bad-signature", "Forbidden", "the download signature is not valid")
    content = await store.agent_package_content(record.version)
    if content is None:
        raise _package_not_found(version)
    return web.Response(
        body=content,
        headers={
            "Content-Type": "application/octet-stream",
            "X-Checksum-Sha256": record.sha256,
            "Content-Disposition": (
                f'attachment; filename="greenfed-{record.version}-py3-none-any.whl"'
            ),
        },
    )


def rollout_view(record: AgentRolloutRecord) -> RolloutView:
    state = record.state
    counts: dict[str, int] = {}
    for entry in state.nodes.values():
        counts[entry.state] = counts.get(entry.state, 0) + 1
    return RolloutView(
        rollout_id=record.rollout_id,
        version=record.version,
        phase=record.phase,
        detail=state.detail,
        created_at=record.created_at,
        created_by=record.created_by,
        finished_at=state.finished_at,
        current_wave=state.current_wave,
        waves=waves_of(state),
        counts=dict(sorted(counts.items())),
        nodes=state.nodes,
        rules=state.rules,
    )


async def create_rollout(request: web.Request) -> web.Response:
    await refuse_unless_caller_active(request, _PUBLISHING_AGENTS)
    rules = await read_json(request, _REQUEST_DECODER)
    store = request.app[STORE]
    if await store.agent_package(rules.version) is None:
        raise _package_not_found(rules.version)
    registry = request.app[REGISTRY]
    nodes = {record.node_id: record for record in registry.nodes()}
    unknown = sorted(set(rules.nodes) - set(nodes))
    if unknown:
        raise Problem(
            422,
            "unknown-nodes",
            "Unknown nodes",
            f"no such node: {', '.join(unknown[:10])}" + (" …" if len(unknown) > 10 else ""),
        )
    targets = rules.nodes or tuple(nodes)
    if not targets:
        raise Problem(409, "no-nodes", "No nodes", "the fleet has no node to upgrade")
    now = time.time()
    rollout_id = _IDS.new_id()
    state = new_rollout(rollout_id, rules, targets, nodes, now)
    record = AgentRolloutRecord(
        rollout_id=rollout_id,
        version=rules.version,
        phase="running",
        created_at=now,
        created_by=tenant_of(request).tenant_id,
        state=state,
    )
    try:
        await store.add_agent_rollout(
            record,
            audit=audit_entry(
                request,
                "agent_rollout.create",
                rollout_id,
                version=rules.version,
                nodes=len(state.nodes),
                canary_percent=rules.canary_percent,
                max_failure_share=rules.max_failure_share,
            ),
        )
    except AgentRolloutRunningError as error:
        raise Problem(
            409,
            "agent-rollout-running",
            "A rollout is running",
            f"rollout {error.rollout_id} is running: wait for it, or cancel it first",
        ) from None
    return json_response(rollout_view(record), status=201)


async def list_rollouts(request: web.Request) -> web.Response:
    records = await request.app[STORE].list_agent_rollouts()
    return json_response(
        RolloutList(items=tuple(rollout_view(r) for r in records), count=len(records))
    )


async def _rollout(request: web.Request) -> AgentRolloutRecord:
    rollout_id = request.match_info["rollout_id"]
    record = await request.app[STORE].agent_rollout(rollout_id[:64])
    if record is None:
        raise _rollout_not_found(rollout_id)
    return record


async def get_rollout(request: web.Request) -> web.Response:
    return json_response(rollout_view(await _rollout(request)))


def _rollout_over(record: AgentRolloutRecord) -> Problem:
    return Problem(
        409,
        "agent-rollout-over",
        "Rollout over",
        f"rollout {record.rollout_id} has {record.phase} already",
    )


async def cancel_rollout(request: web.Request) -> web.Response:
    record = await _rollout(request)
    if record.phase != "running":
        raise _rollout_over(record)
    state = msgspec.structs.replace(
        record.state, finished_at=time.time(), detail="cancelled by an admin"
    )
    cancelled = await request.app[STORE].save_agent_rollout(
        record.rollout_id,
        "cancelled",
        state,
        from_phase="running",
        audit=audit_entry(request, "agent_rollout.cancel", record.rollout_id),
    )
    if not cancelled:  # the loop ended it since it was read
        raise _rollout_over(await _rollout(request))
    # The store kept the nodes' progress the loop saved since `record` was read (only
    # when and why it ended come from `state`); nothing writes a cancelled rollout, so
    # reading it again shows what was stored.
    return json_response(rollout_view(await _rollout(request)))


_NO_PACKAGE = problem_reply(404, "No such agent version is published")
_NO_ROLLOUT = problem_reply(404, "No such rollout")

ROUTES: Final = (
    Route(
        "POST",
        "/v1/agent-packages",
        publish_package,
        "Publish an agent version (admin): a greenfed wheel as the body, checked and signed",
        "admin",
        "agent upgrades",
        body=bytes,
        body_media_type="application/octet-stream",
        replies=(
            Reply(201, "The package, signed", PackageView),
            ADMIN_MINTING_REFUSAL,
            problem_reply(409, "That version is published already"),
            problem_reply(422, "Not a greenfed wheel; detail says why"),
        ),
    ),
    Route(
        "GET",
        "/v1/agent-packages",
        list_packages,
        "List the published agent versions (admin)",
        "admin",
        "agent upgrades",
        replies=(Reply(200, "Every published version, oldest first", PackageList),),
    ),
    Route(
        "GET",
        "/v1/agent-packages/{version}",
        get_package,
        "One published agent version (admin)",
        "admin",
        "agent upgrades",
        replies=(Reply(200, "The package", PackageView), _NO_PACKAGE),
    ),
    Route(
        "GET",
        "/v1/agent-packages/{version}/wheel",
        get_package_wheel,
        "Download an agent version's wheel: agents use the signed URL of their document",
        "signed",
        "agent upgrades",
        replies=(Reply(200, "The .whl file", None, "application/octet-stream"),),
    ),
    Route(
        "POST",
        "/v1/agent-rollouts",
        create_rollout,
        "Roll an agent version out to the fleet, or to some nodes, in waves (admin)",
        "admin",
        "agent upgrades",
        body=RolloutRequest,
        replies=(
            Reply(201, "The rollout, its canaries asked already", RolloutView),
            ADMIN_MINTING_REFUSAL,
            _NO_PACKAGE,
            problem_reply(409, "A rollout is running already, or there are no nodes"),
            problem_reply(422, "A named node is unknown"),
        ),
    ),
    Route(
        "GET",
        "/v1/agent-rollouts",
        list_rollouts,
        "List the latest rollouts, newest first (admin)",
        "admin",
        "agent upgrades",
        replies=(Reply(200, "The latest 50 rollouts", RolloutList),),
    ),
    Route(
        "GET",
        "/v1/agent-rollouts/{rollout_id}",
        get_rollout,
        "One rollout: its waves and each node's state (admin)",
        "admin",
        "agent upgrades",
        replies=(Reply(200, "The rollout", RolloutView), _NO_ROLLOUT),
    ),
    Route(
        "POST",
        "/v1/agent-rollouts/{rollout_id}/cancel",
        cancel_rollout,
        "Cancel a running rollout (admin): no node is asked further; upgraded ones stay",
        "admin",
        "agent upgrades",
        replies=(
            Reply(200, "The rollout, cancelled", RolloutView),
            _NO_ROLLOUT,
            problem_reply(409, "The rollout is over already"),
        ),
    ),
)
