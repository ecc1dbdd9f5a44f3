"""Node enrolment: join tokens (admin), `POST /v1/nodes/enrol` (a node trades a token
for its own MQTT credentials, the cluster id and the control plane's public key, and
pins its own sealing key: job secrets are sealed only to it), and node revocation (admin).

What an anonymous caller can learn here: only that a token was refused (401), never
whether it was unknown, expired, used up or revoked (the log says which), nor anything
about the node id it names (the token is judged first: whether an id is in use is told
only to a caller whose token is redeemable). Refused tokens are rate-limited per remote
address, in the store so that every replica shares the budget
(cloud/store/enrolment_failures.py): guessing tokens costs time even before their 256
random bits make it hopeless, and a valid token is never held up by them.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Final

import msgspec
import structlog
from aiohttp import web

from cloud.api.audit import audit_entry
from cloud.api.auth import tenant_of
from cloud.api.bodies import invalid_body, json_response, read_json
from cloud.api.bulk_actions import destructive
from cloud.api.credential_minting import ADMIN_MINTING_REFUSAL, refuse_unless_caller_active
from cloud.api.problems import Problem, problem_reply
from cloud.api.routes import Reply, Route
from cloud.app_keys import (
    BACKGROUND_TASKS,
    BROKER_ACCOUNTS,
    ENROLLED_NODES,
    INGESTOR,
    REGISTRY,
    SETTINGS,
    SIGNING_KEY,
    STORE,
)
from cloud.broker_accounts import BrokerAccountError, ForeignAccountError
from cloud.fleet.certificates import CertificateAuthority
from cloud.fleet.enrolled import Changes, EnrolledIds, EnrolledNodes
from cloud.fleet.enrolment_views import (
    EnrolledMqtt,
    EnrolledNodeList,
    EnrolledNodeView,
    Enrolment,
    EnrolmentAuthority,
    EnrolRequest,
    JoinTokenCreate,
    JoinTokenCreated,
    JoinTokenList,
    JoinTokenView,
    sealing_key_fingerprint,
)
from cloud.fleet.envelope import NodeEnvelope
from cloud.fleet.node_admin import apply_one
from cloud.fleet.unenrolled import UnenrolledNodes
from cloud.loop.publisher import CLUSTER_ID_SECRET
from cloud.store import Store
from cloud.store.enrolment import (
    EnrolledNodeRecord,
    JoinTokenRecord,
    NewJoinToken,
    NodeDefaults,
)
from cloud.store.enrolment_failures import FailureBudget
from cloud.store.errors import JoinTokenError, JoinTokenUnknownError, NodeAlreadyEnrolledError
from cloud.store.node_admin import without_approval
from shared.clock import utc_from_epoch
from shared.logs import RateLimitedLog
from shared.settings import RESERVED_NODE_IDS, parse_mqtt_url
from shared.tasks import stop_task
from shared.topics import Channel, is_valid_node_id

_CREATE_DECODER: Final = msgspec.json.Decoder(JoinTokenCreate)
_ENROL_DECODER: Final = msgspec.json.Decoder(EnrolRequest)
# What only an active token may do here (cloud/api/credential_minting.py), as refused.
_CREATING_JOIN_TOKENS: Final = "create join tokens"
_log = structlog.get_logger("greenfed.enrolment")


@dataclass
class EnrolmentState:
    # Nodes refused as not enrolled that prove a certificate of ours (re-admission).
    unenrolled: UnenrolledNodes
    # Refused tokens per remote address, shared by every replica through the store.
    failures: FailureBudget = field(default_factory=FailureBudget)
    refused_log: RateLimitedLog = field(default_factory=lambda: RateLimitedLog(_log, 10.0))
    # Issues certificates with the signing key (made from it on first use).
    authority: CertificateAuthority | None = None


ENROLMENT_STATE = web.AppKey("enrolment_state", EnrolmentState)


def install(app: web.Application) -> None:
    """The enrolled-node gate of ingestion and what the handlers share (call it in
    `create_app`; `enrolled_nodes_context` loads the gate once the store is open)."""
    settings = app[SETTINGS]
    enrolled = EnrolledNodes(required=settings.cloud.require_enrolment)
    app[ENROLLED_NODES] = enrolled
    unenrolled = UnenrolledNodes(
        app[REGISTRY].wall_clock, log_interval_s=settings.cloud.invalid_log_interval_s
    )
    app[ENROLMENT_STATE] = EnrolmentState(unenrolled)
    app[INGESTOR].admits_node = enrolled.admits
    app[INGESTOR].unenrolled_birth = unenrolled.offer
    app[INGESTOR].unenrolled_report = unenrolled.note_report
    app[INGESTOR].pinned_sealing_key = enrolled.pinned_sealing_key
    app[REGISTRY].envelope_of = enrolled.envelope


async def _load_ids(store: Store) -> EnrolledIds:
    records = await store.list_enrolled_nodes()
    return EnrolledIds(
        active=frozenset(r.node_id for r in records if r.active),
        revoked=frozenset(r.node_id for r in records if not r.active),
        sealing_keys={
            r.node_id: r.sealing_public_key
            for r in records
            if r.active and r.sealing_public_key is not None
        },
        envelopes={r.node_id: r.envelope for r in records if r.active and r.envelope is not None},
    )


async def enrolled_nodes_context(app: web.Application) -> AsyncIterator[None]:
    """Load the enrolled node ids before ingestion starts, then keep them current (other
    replicas enrol and revoke too); nodes no longer admitted leave the registry."""
    store = app[STORE]
    enrolled = app[ENROLLED_NODES]
    enrolled.replace(await _load_ids(store))
    # Before ingestion starts, so that the first births can be judged for re-admission.
    _authority(app)

    def changed(changes: Changes) -> None:
        registry = app[REGISTRY]
        for node_id in changes.refused:
            if registry.forget(node_id):
                _log.info("node refused: no longer enrolled", node_id=node_id)
        registry.judge_again(changes.envelopes)
        ingest_knocking_births(app, changes.admitted)
        app[INGESTOR].notify_change()

    task = asyncio.create_task(
        enrolled.refresh_forever(lambda: _load_ids(store), changed), name="enrolled-nodes"
    )
    app[BACKGROUND_TASKS].append(task)
    try:
        yield
    finally:
        await stop_task(task)


def _token_fields(record: JoinTokenRecord) -> dict[str, object]:
    defaults = record.defaults
    return {
        "id": record.token_id,
        "state": record.state(time.time()),
        "created_at": utc_from_epoch(record.created_at),
        "expires_at": utc_from_epoch(record.expires_at),
        "uses": record.uses,
        "max_uses": record.max_uses,
        "revoked_at": None if record.revoked_at is None else utc_from_epoch(record.revoked_at),
        "site": defaults.site,
        "zone": defaults.zone,
        "region": defaults.region,
        "labels": dict(defaults.labels),
        "created_by": record.created_by,
        **_limit_fields(record.limits),
    }


def _limit_fields(limits: NodeEnvelope | None) -> dict[str, object]:
    limits = limits or NodeEnvelope()
    return {
        "work": limits.work,
        "max_accelerators": dict(limits.max_accelerators),
        "accelerator_models": limits.accelerator_models,
        "max_accelerator_memory_bytes": limits.max_accelerator_memory_bytes,
    }


def enrolled_node_view(record: EnrolledNodeRecord) -> EnrolledNodeView:
    return EnrolledNodeView(
        node_id=record.node_id,
        state="enrolled" if record.active else "revoked",
        enrolled_at=utc_from_epoch(record.enrolled_at),
        join_token_id=record.join_token_id,
        revoked_at=None if record.revoked_at is None else utc_from_epoch(record.revoked_at),
        username=record.username,
        sealing_key_fingerprint=(
            None
            if record.sealing_public_key is None
            else sealing_key_fingerprint(record.sealing_public_key)
        ),
        envelope=record.envelope,
    )


async def create_join_token(request: web.Request) -> web.Response:
    # A join token enrols nodes, each with a broker account: a credential.
    await refuse_unless_caller_active(request, _CREATING_JOIN_TOKENS)
    body = await read_json(request, _CREATE_DECODER)
    settings = request.app[SETTINGS]
    ttl_s = body.ttl_s if body.ttl_s is not None else settings.cloud.join_token_ttl_s
    created = await request.app[STORE].create_join_token(
        NewJoinToken(
            ttl_s=ttl_s,
            max_uses=body.uses,
            defaults=NodeDefaults(
                site=body.site, zone=body.zone, region=body.region, labels=body.labels
            ),
            created_by=tenant_of(request).tenant_id,
            limits=None if body.envelope() == NodeEnvelope() else body.envelope(),
        ),
        audit=audit_entry(
            request,
            "join-token.create",
            "",
            ttl_s=ttl_s,
            uses=body.uses,
            **msgspec.to_builtins(body.envelope()),
        ),
    )
    _log.info(
        "join token created",
        token_id=created.record.token_id,
        max_uses=created.record.max_uses,
        expires_at=created.record.expires_at,
        tenant_id=created.record.created_by,
    )
    reply = JoinTokenCreated(**_token_fields(created.record), token=created.token)  # type: ignore[arg-type]
    return json_response(reply, status=201)


async def list_join_tokens(request: web.Request) -> web.Response:
    records = await request.app[STORE].list_join_tokens()
    views = tuple(JoinTokenView(**_token_fields(r)) for r in records)  # type: ignore[arg-type]
    return json_response(JoinTokenList(items=views, count=len(views)))


async def revoke_join_token(request: web.Request) -> web.Response:
    token_id = request.match_info["token_id"]
    try:
        record = await request.app[STORE].revoke_join_token(
            token_id, audit=audit_entry(request, "join-token.revoke", token_id)
        )
    except JoinTokenUnknownError:
        raise Problem(
            404, "join-token-not-found", "Join token not found", f"no join token {token_id!r}"
        ) from None
    _log.info("join token revoked", token_id=token_id)
    return json_response(JoinTokenView(**_token_fields(record)))  # type: ignore[arg-type]


def public_mqtt_url(url: str) -> str:
    """The broker's URL as a node should use it: scheme, host and port, no credentials."""
    endpoint = parse_mqtt_url(url)
    host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
    return f"{'mqtts' if endpoint.tls else 'mqtt'}://{host}:{endpoint.port}"


def _authority(app: web.Application) -> CertificateAuthority:
    state = app[ENROLMENT_STATE]
    if state.authority is None:
        state.authority = CertificateAuthority(app[SIGNING_KEY])
        state.unenrolled.authority = state.authority
    return state.authority


def ingest_knocking_births(app: web.Application, node_ids: Iterable[str]) -> int:
    """Ingest again the last birth and `reported` document of nodes that knocked and are
    admitted now (by this replica or another): online at once, not at their next birth;
    what they run known at once. How many there were."""
    ingestor = app[INGESTOR]
    knocking = app[ENROLMENT_STATE].unenrolled.admitted(node_ids)
    for node in knocking:
        node_id = node.status.node_id
        ingestor.handle(ingestor.topics.node(node_id, Channel.STATUS), node.payload)
        if node.report is not None:
            ingestor.handle(ingestor.topics.node(node_id, Channel.REPORTED), node.report)
    return len(knocking)


async def _refused(
    request: web.Request, address: str, error: JoinTokenError, node_id: str
) -> Problem:
    """The answer to a refused token: 401, or 429 once its address has had too many
    refused (a budget every replica shares, in the store). A valid token is never
    refused for its address: only guesses wait."""
    state = request.app[ENROLMENT_STATE]
    store = request.app[STORE]
    state.refused_log.warning(
        f"join-token/{error.reason}",
        "enrolment refused",
        reason=error.reason,
        token_id=error.token_id,
        node_id=node_id,
        remote=address,
    )
    wait_s = await store.enrolment_retry_after_s(address, state.failures)
    if wait_s > 0:
        return Problem(
            429,
            "too-many-attempts",
            "Too many failed enrolments",
            f"too many refused join tokens from {address}; retry in {wait_s:.0f} s",
            headers={"Retry-After": str(max(1, math.ceil(wait_s)))},
        )
    await store.record_enrolment_failure(address, state.failures)
    return Problem(
        401,
        "join-token-refused",
        "Join token refused",
        "the join token is not valid (unknown, expired, used up or revoked): ask an admin "
        "for a new one (greenfed nodes join-token create)",
    )


def _announced_key(app: web.Application, node_id: str) -> tuple[bool, str | None]:
    """Whether a node the store has not enrolled uses `node_id`, and the sealing key it
    announces: one in the registry (a cluster without `cloud.require_enrolment`), or
    one knocking with a proven certificate after a store loss (not revoked since)."""
    record = app[REGISTRY].get(node_id)
    if record is not None:
        return True, record.status.sealing_public_key
    knocking = app[ENROLMENT_STATE].unenrolled.get(node_id)
    if knocking is not None and not app[ENROLLED_NODES].is_revoked(node_id):
        return True, knocking.certificate.sealing_public_key
    return False, None


def _not_anothers(
    app: web.Application, node_id: str, sealing_public_key: str | None, *, key_proven: bool
) -> None:
    """Refuse to enrol a node id in use (`_announced_key`), unless the enrolling node
    proves it is that node: it holds the sealing key that node's births announce
    (`key_proven`: the key alone is public). Else a join token could take the id of a
    live node that has not enrolled, or of a knocking node waiting to be re-admitted
    (resetting its broker password), and the real node could never enrol."""
    in_use, announced = _announced_key(app, node_id)
    if not in_use:
        return
    if key_proven and announced is not None and announced == sealing_public_key:
        return
    raise Problem(
        409,
        "node-id-in-use",
        "Node id in use",
        f"a node {node_id!r} is known to the control plane already (live, or knocking to be "
        "re-admitted: greenfed nodes unenrolled) and this enrolment does not prove it holds "
        "the sealing key its births announce: enrol from that node (greenfed edge enrol "
        "there), re-admit it, or choose another node id",
    )


async def enrolment_authority(request: web.Request) -> web.Response:
    """The public key a node that enrols again proves its sealing key against."""
    return json_response(EnrolmentAuthority(exchange_key=_authority(request.app).exchange_key))


async def _token_redeemable(request: web.Request, address: str, body: EnrolRequest) -> bool:
    """Whether the join token is redeemable now, from reads. One that is not, from an
    address refused too often, is answered here (429): a flood of guesses never takes
    the write transaction a redemption takes. One that is not, from an address with
    budget left, goes on to the redemption, which says why it is refused (for the log)
    and counts it against the address."""
    store = request.app[STORE]
    if await store.join_token_is_redeemable(body.token):
        return True
    if await store.enrolment_retry_after_s(address, request.app[ENROLMENT_STATE].failures) > 0:
        raise await _refused(request, address, JoinTokenError(None), body.node_id)
    return False


async def enrol(request: web.Request) -> web.Response:
    app = request.app
    address = request.remote or "unknown"
    body = await read_json(request, _ENROL_DECODER)
    if body.node_id in RESERVED_NODE_IDS:
        # GET /v1/nodes/{node_id} would reach that route instead of the node.
        raise invalid_body("$.node_id", "is reserved: it names a route under /v1/nodes/")
    store = app[STORE]
    # What can fail without side effects first: once the token is spent and the
    # account made, nothing may fail before the answer carries the password.
    cluster_id = await store.shared_secret(CLUSTER_ID_SECRET)
    authority = _authority(app)
    # The token before the node id: a caller without a redeemable token gets the same
    # 401 (or 429) whatever id it names, so it cannot probe which ids are in use.
    token_was_redeemable = await _token_redeemable(request, address, body)
    key_proven = (
        body.sealing_public_key is not None
        and body.identity_proof is not None
        and authority.proves_key(
            body.identity_proof,
            body.sealing_public_key,
            node_id=body.node_id,
            join_token=body.token,
        )
    )
    if token_was_redeemable:
        _not_anothers(app, body.node_id, body.sealing_public_key, key_proven=key_proven)
    try:
        redemption = await store.redeem_join_token(
            body.token,
            body.node_id,
            sealing_public_key=body.sealing_public_key,
            requested=NodeDefaults(site=body.site, zone=body.zone, region=body.region),
            key_proven=key_proven,
        )
    except JoinTokenError as error:
        raise await _refused(request, address, error, body.node_id) from None
    except NodeAlreadyEnrolledError:
        raise Problem(
            409,
            "node-already-enrolled",
            "Node already enrolled",
            f"node {body.node_id!r} is enrolled already, and this enrolment does not prove "
            "it holds the sealing key it enrolled with: the node itself enrols again from "
            "its own data directory (greenfed edge enrol there proves its key), or an "
            f"admin revokes it first (greenfed nodes revoke {body.node_id}) to enrol a new one",
        ) from None
    if not token_was_redeemable:
        # Redeemed all the same: a use was given back between the read and the redemption
        # (another enrolment's broker failed). The node id check skipped above, now.
        try:
            _not_anothers(app, body.node_id, body.sealing_public_key, key_proven=key_proven)
        except Problem:
            await store.release_redemption(redemption)
            raise
    try:
        credentials = await app[BROKER_ACCOUNTS].provision(body.node_id)
    except ForeignAccountError as error:
        await store.release_redemption(redemption)
        _log.warning("enrolment refused: foreign account", node_id=body.node_id, error=str(error))
        raise Problem(
            409,
            "node-id-taken",
            "Node id taken",
            f"the MQTT broker has an account {body.node_id!r} that is not a greenfed node's; "
            "choose another node id (the join token was not used)",
        ) from None
    except BrokerAccountError as error:
        await store.release_redemption(redemption)
        _log.warning("enrolment failed: broker account", node_id=body.node_id, error=str(error))
        raise Problem(
            503,
            "broker-accounts-unavailable",
            "Broker accounts unavailable",
            f"the MQTT broker did not create the node's account ({error}); the join token "
            "was not used: retry",
            headers={"Retry-After": "5"},
        ) from None
    await store.set_enrolled_username(body.node_id, credentials.username)
    envelope = redemption.node.envelope or NodeEnvelope()
    app[ENROLLED_NODES].enrolled(body.node_id, body.sealing_public_key, envelope)
    registry = app[REGISTRY]
    # What the store cleared of its approval, here at once (other replicas within 2 s).
    approval, approval_changed = redemption.approval, False
    if approval.changed and approval.after is not None:
        approval_changed = apply_one(registry, approval.after)
    if registry.judge_again([body.node_id]) or approval_changed:
        app[INGESTOR].notify_change()
    settings = app[SETTINGS]
    defaults = redemption.token.defaults
    _log.info(
        "node enrolled",
        node_id=body.node_id,
        token_id=redemption.token.token_id,
        username=credentials.username,
        sealing_key=(
            None
            if body.sealing_public_key is None
            else sealing_key_fingerprint(body.sealing_public_key)
        ),
    )
    reply = Enrolment(
        node_id=body.node_id,
        cluster_id=cluster_id,
        control_plane_public_key=authority.public_key_text,
        mqtt=EnrolledMqtt(
            url=public_mqtt_url(settings.mqtt.url),
            topic_root=settings.mqtt.topic_root,
            username=credentials.username,
            password=credentials.password,
        ),
        # What the agent's settings get: what it may be, else the agent's defaults.
        site=envelope.site or "edge",
        zone=envelope.zone or "unknown",
        region=envelope.region or "unknown",
        labels={**body.labels, **defaults.labels},
        enrolment_certificate=(
            None
            if body.sealing_public_key is None
            else authority.issue(
                cluster_id=cluster_id,
                node_id=body.node_id,
                sealing_public_key=body.sealing_public_key,
                envelope=envelope,
                enrolled_at=redemption.node.enrolled_at,
                join_token_id=redemption.token.token_id,
                username=credentials.username,
            )
        ),
    )
    return json_response(reply)


async def list_enrolled_nodes(request: web.Request) -> web.Response:
    records = await request.app[STORE].list_enrolled_nodes()
    views = tuple(enrolled_node_view(r) for r in records)
    return json_response(EnrolledNodeList(items=views, count=len(views)))


def _foreign_account_left_alone(node_id: str, error: ForeignAccountError) -> Problem:
    """A revoked node whose name is a broker account greenfed did not make for it."""
    return Problem(
        409,
        "foreign-broker-account",
        "Broker account not greenfed's",
        f"node {node_id!r} is revoked in the control plane (it ingests nothing more from "
        f"it), but the MQTT broker's account {node_id!r} is not a greenfed node's of this "
        f"fleet ({error}), so it was left untouched: disable it on the broker by hand if "
        "it should not connect",
    )


@destructive("node.revoke")  # bulk revocations need a confirmation
async def revoke_node(request: web.Request) -> web.Response:
    app = request.app
    node_id = request.match_info["node_id"]
    store = app[STORE]
    registry = app[REGISTRY]
    # A knocking node (refused as not enrolled after a store loss, proving a certificate
    # of ours) is revocable too: its revoked row keeps `readmit` from admitting it.
    known = is_valid_node_id(node_id) and (
        registry.get(node_id) is not None
        or app[ENROLMENT_STATE].unenrolled.get(node_id) is not None
        or await store.get_enrolled_node(node_id) is not None
    )
    if not known:
        raise Problem(404, "node-not-found", "Node not found", f"no node {node_id!r}")
    # Refused here first: whatever the broker says, this control plane ingests nothing more.
    record = await store.revoke_node(node_id, audit=audit_entry(request, "node.revoke", node_id))
    app[ENROLLED_NODES].revoked(node_id)
    # Its approval went with it in the store; here at once (other replicas within 2 s).
    admin = registry.admin.get(node_id)
    if admin is not None:
        apply_one(registry, without_approval(admin, same_device=False))
    if registry.forget(node_id):
        app[INGESTOR].notify_change()
    try:
        await app[BROKER_ACCOUNTS].revoke(node_id)
    except ForeignAccountError as error:
        # Never a retry: the account is not ours, and asking again changes nothing.
        _log.warning("node revoked; broker account left alone", node_id=node_id, error=str(error))
        raise _foreign_account_left_alone(node_id, error) from None
    except BrokerAccountError as error:
        raise Problem(
            503,
            "broker-accounts-unavailable",
            "Broker accounts unavailable",
            f"node {node_id!r} is revoked in the control plane, but the MQTT broker did not "
            f"disable its account ({error}): retry",
            headers={"Retry-After": "5"},
        ) from None
    _log.info("node revoked", node_id=node_id)
    return json_response(enrolled_node_view(record))


ROUTES: Final = (
    Route(
        "POST",
        "/v1/nodes/join-tokens",
        create_join_token,
        "Create a join token (admin); the reply holds the token, shown only this once",
        "admin",
        "enrolment",
        body=JoinTokenCreate,
        replies=(Reply(201, "The token and its limits", JoinTokenCreated), ADMIN_MINTING_REFUSAL),
    ),
    Route(
        "GET",
        "/v1/nodes/join-tokens",
        list_join_tokens,
        "List the join tokens (admin; no secrets)",
        "admin",
        "enrolment",
        replies=(Reply(200, "Every join token, oldest first", JoinTokenList),),
    ),
    Route(
        "DELETE",
        "/v1/nodes/join-tokens/{token_id}",
        revoke_join_token,
        "Revoke a join token (admin): nodes enrolled with it stay enrolled",
        "admin",
        "enrolment",
        replies=(Reply(200, "The revoked token", JoinTokenView),),
    ),
    Route(
        "GET",
        "/v1/nodes/enrol",
        enrolment_authority,
        "The key an enrolment's identity proof is made against (public)",
        "public",
        "enrolment",
        description=(
            "A node enrolled already enrols again (new credentials, another join token) "
            "only if it proves it holds the sealing key it enrolled with: the key itself "
            "is public, announced in every birth."
        ),
        replies=(Reply(200, "The control plane's X25519 exchange key", EnrolmentAuthority),),
    ),
    Route(
        "POST",
        "/v1/nodes/enrol",
        enrol,
        "Trade a join token for the node's MQTT credentials and the control plane's key",
        "public",
        "enrolment",
        body=EnrolRequest,
        description=(
            "No bearer token: the join token in the body is the credential. Every refused "
            "token is the same 401; refusals are rate-limited per remote address (429)."
        ),
        replies=(
            Reply(200, "What the agent's settings need", Enrolment),
            problem_reply(401, "The join token is not valid"),
            problem_reply(409, "The node id is enrolled already"),
            problem_reply(429, "Too many refused tokens from this address"),
            problem_reply(503, "The broker did not create the account; the token was not used"),
        ),
    ),
    Route(
        "GET",
        "/v1/nodes/enrolled",
        list_enrolled_nodes,
        "List the enrolled node identities (admin), revoked ones included",
        "admin",
        "enrolment",
        replies=(Reply(200, "Every enrolled node id", EnrolledNodeList),),
    ),
    Route(
        "POST",
        "/v1/nodes/{node_id}/revoke",
        revoke_node,
        "Revoke a node (admin): refused at once, its broker account disabled",
        "admin",
        "enrolment",
        replies=(
            Reply(200, "The node's revoked identity", EnrolledNodeView),
            problem_reply(
                409,
                "Revoked here, but the broker's account of that name is not greenfed's: "
                "left untouched",
            ),
            problem_reply(503, "Revoked here, but the broker did not disable the account"),
        ),
    ),
)
