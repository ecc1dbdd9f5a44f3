"""The REST shapes of node enrolment (`/v1/nodes/join-tokens`, `/v1/nodes/enrol`,
`/v1/nodes/{node_id}/revoke`, `/v1/nodes/enrolled`, `/v1/nodes/unenrolled`,
`/v1/nodes/readmit`), shared by the API and the CLI.

Times are UTC datetimes. No shape but `JoinTokenCreated` ever carries a token, and it
is sent once.
"""

from __future__ import annotations

import base64
import hashlib
from datetime import datetime
from typing import Annotated, Final

import msgspec

# The wire contract's node id (one topic level; no trailing newline either).
from cloud.fleet.envelope import NodeEnvelope, WorkKinds
from shared.errors import FieldError, worded_pattern
from shared.messages import AcceleratorKind, NodeId, Site
from shared.placement_names import (
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    MAX_LABEL_KEY_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_PLACEMENT_CHARS,
    ZONE_PATTERN,
)
from shared.sealing import is_valid_public_key

JOIN_TOKEN_MAX_USES: Final = 10_000
# Each pattern is worded (shared/errors.py): a refusal says what it takes, not the regex.
# A zone or region: a cluster's too (cloud/clusters/views.py), so worded here once.
Zone = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_PLACEMENT_CHARS,
        pattern=worded_pattern(
            ZONE_PATTERN,
            "must be a zone or region name: letters, digits, '.', '_', ':', '/' and '-', "
            f"starting and ending with a letter or digit; at most {MAX_PLACEMENT_CHARS} "
            "characters",
        ),
    ),
]
_LABEL_KEY = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_LABEL_KEY_CHARS,
        pattern=worded_pattern(
            LABEL_KEY_PATTERN,
            "must be a label key: letters, digits, '.', '_', '/' and '-', starting and "
            f"ending with a letter or digit; at most {MAX_LABEL_KEY_CHARS} characters",
        ),
    ),
]
_LABEL_VALUE = Annotated[
    str,
    msgspec.Meta(
        max_length=MAX_LABEL_VALUE_CHARS,
        pattern=worded_pattern(
            LABEL_VALUE_PATTERN,
            "must be printable text, not starting with '=', '+', '-', '@' or whitespace; "
            f"at most {MAX_LABEL_VALUE_CHARS} characters",
        ),
    ),
]
Labels = Annotated[dict[_LABEL_KEY, _LABEL_VALUE], msgspec.Meta(max_length=64)]
_MODEL = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class _Body(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class JoinTokenCreate(_Body, frozen=True, kw_only=True):
    # Default: cloud.join_token_ttl_s. At most a year.
    ttl_s: Annotated[float, msgspec.Meta(gt=0, le=366 * 86400)] | None = None
    uses: Annotated[int, msgspec.Meta(ge=1, le=JOIN_TOKEN_MAX_USES)] = 1
    site: Site | None = None
    zone: Zone | None = None
    region: Zone | None = None
    labels: Labels = {}
    # What nodes enrolled with it may be beyond site, zone and region (a birth outside
    # it waits for an admin's approval; cloud/fleet/envelope.py).
    work: WorkKinds = "any"
    max_accelerators: Annotated[
        dict[AcceleratorKind, Annotated[int, msgspec.Meta(ge=0, le=1 << 20)]],
        msgspec.Meta(
            description=(
                "At most this many accelerators of each kind (a kind not named: none; CPUs "
                "count sockets). Empty: no ceiling, the node's first birth sets it."
            )
        ),
    ] = {}
    accelerator_models: Annotated[tuple[_MODEL, ...], msgspec.Meta(max_length=64)] = ()
    max_accelerator_memory_bytes: Annotated[int, msgspec.Meta(ge=1)] | None = None

    def envelope(self) -> NodeEnvelope:
        """The limits it sets beyond site, zone and region."""
        return NodeEnvelope(
            work=self.work,
            max_accelerators=self.max_accelerators,
            accelerator_models=self.accelerator_models,
            max_accelerator_memory_bytes=self.max_accelerator_memory_bytes,
        )


class JoinTokenView(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    state: str  # active, expired, used-up, revoked
    created_at: datetime
    expires_at: datetime
    uses: int  # how many nodes enrolled with it
    max_uses: int
    revoked_at: datetime | None
    site: Site | None
    zone: str | None
    region: str | None
    labels: dict[str, str]
    created_by: str | None  # the admin tenant's id
    work: WorkKinds = "any"
    max_accelerators: dict[AcceleratorKind, int] = {}
    accelerator_models: tuple[str, ...] = ()
    max_accelerator_memory_bytes: int | None = None


class JoinTokenCreated(JoinTokenView, frozen=True, kw_only=True):
    token: str  # shown this once; the control plane keeps only its hash


class JoinTokenList(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[JoinTokenView, ...]
    count: int


class EnrolRequest(_Body, frozen=True, kw_only=True):
    token: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    node_id: NodeId
    # Used only where the token names none (the admin's choice wins).
    site: Site | None = None
    zone: Zone | None = None
    region: Zone | None = None
    labels: Labels = {}
    sealing_public_key: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=64,
                description=(
                    "Base64 of the node's X25519 public key: the control plane pins it, and "
                    "seals job secrets only to a node whose birth announces this key."
                ),
            ),
        ]
        | None
    ) = None
    identity_proof: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=64,
                description=(
                    "Proof that the sender holds the private half of sealing_public_key "
                    "(shared/enrolment_certificate.py `enrolment_proof`, against the key "
                    "GET /v1/nodes/enrol gives): what enrolling an id again takes."
                ),
            ),
        ]
        | None
    ) = None

    def __post_init__(self) -> None:
        if self.sealing_public_key is not None and not is_valid_public_key(self.sealing_public_key):
            raise FieldError("sealing_public_key", "is not base64 of a 32-byte X25519 key")


class EnrolledMqtt(msgspec.Struct, frozen=True, kw_only=True):
    url: str  # the broker, without credentials
    topic_root: str
    username: str
    password: str | None  # None: accounts are managed by hand (cloud.broker_accounts = "none")


class EnrolmentAuthority(msgspec.Struct, frozen=True, kw_only=True):
    """What `GET /v1/nodes/enrol` answers: public, for a node that enrols again."""

    # Base64 of the control plane's X25519 public key, which an enrolment's identity proof
    # is made against (the same as in every enrolment certificate it issues).
    exchange_key: str


class Enrolment(msgspec.Struct, frozen=True, kw_only=True):
    """What `POST /v1/nodes/enrol` answers: everything the agent's settings need."""

    node_id: str
    cluster_id: str
    control_plane_public_key: str  # base64 of the raw 32-byte Ed25519 public key
    mqtt: EnrolledMqtt
    site: Site
    zone: str
    region: str
    labels: dict[str, str]
    # What the control plane certifies the node enrolled as (cloud/fleet/certificates.py):
    # its births show it, so that a control plane that lost its store can re-admit it.
    # Null where the node sent no sealing key.
    enrolment_certificate: str | None = None


class EnrolledNodeView(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    state: str  # enrolled, revoked
    enrolled_at: datetime
    join_token_id: str | None
    revoked_at: datetime | None
    username: str | None
    # Of the sealing key pinned at enrolment (a public key: not secret); null: none pinned.
    sealing_key_fingerprint: str | None = None
    # What it may be (cloud/fleet/envelope.py); null: not held (enrolled before store v13).
    envelope: NodeEnvelope | None = None


def sealing_key_fingerprint(public_key: str) -> str:
    """`sha256:` and the first 16 hex digits of the SHA-256 of a base64 public key's raw
    bytes: enough for a person to compare two keys."""
    return "sha256:" + hashlib.sha256(base64.b64decode(public_key)).hexdigest()[:16]


class EnrolledNodeList(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[EnrolledNodeView, ...]
    count: int


class UnenrolledNodeView(msgspec.Struct, frozen=True, kw_only=True):
    """A node refused as not enrolled whose birth proves what this control plane once
    certified it enrolled as: what `POST /v1/nodes/readmit` would enrol it as."""

    node_id: str
    # unenrolled: may be re-admitted; enrolled: admitted meanwhile; revoked: an admin
    # revoked it after the certificate was issued, and that stands.
    state: str
    enrolled_at: datetime  # when it first enrolled, as its certificate says
    cluster_id: str  # the cluster it enrolled with (another one, after a store loss)
    join_token_id: str | None
    sealing_key_fingerprint: str
    envelope: NodeEnvelope
    # What its birth says now (held to the envelope once re-admitted).
    site: Site
    zone: str
    region: str
    instance_id: str
    first_seen_at: datetime
    last_seen_at: datetime


class UnenrolledNodeList(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[UnenrolledNodeView, ...]
    count: int


class ReadmitRequest(_Body, frozen=True, kw_only=True):
    node_ids: Annotated[tuple[NodeId, ...], msgspec.Meta(max_length=10_000)] = ()
    # Every node listed by GET /v1/nodes/unenrolled as unenrolled (instead of node_ids).
    all: bool = False

    def __post_init__(self) -> None:
        if self.all and self.node_ids:
            raise FieldError("all", "give node_ids or all, not both")
        if not self.all and not self.node_ids:
            raise FieldError("node_ids", "name at least one node, or set all to true")


class ReadmitRefusal(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    reason: str  # not-knocking, enrolled, revoked
    detail: str


class ReadmitResult(msgspec.Struct, frozen=True, kw_only=True):
    readmitted: tuple[EnrolledNodeView, ...]
    refused: tuple[ReadmitRefusal, ...]
