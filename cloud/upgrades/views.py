"""What the agent-upgrade API takes and gives, and the rollout state the store keeps."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from shared.messages import AGENT_VERSION_FIELD_PATTERN, NodeId

RolloutPhase = Literal["running", "succeeded", "halted", "cancelled"]
ACTIVE_PHASE: Final = "running"
# A node's place in a rollout: its wave has not started (`waiting`), it was asked to
# upgrade (`upgrading`), it runs the version (`upgraded`), it reported the upgrade did
# not take or did not answer within the wave's bound (`failed`), or it cannot upgrade
# itself at all (`skipped`: no supervisor runs its agent, or an older agent).
NodeUpgradeState = Literal["waiting", "upgrading", "upgraded", "failed", "skipped"]
MAX_ROLLOUT_NODES: Final = 100_000

# The wire's version pattern, and so its words (a pattern has one wording).
Version = Annotated[str, msgspec.Meta(pattern=AGENT_VERSION_FIELD_PATTERN)]


class PackageView(msgspec.Struct, frozen=True, kw_only=True):
    version: str
    sha256: str
    size_bytes: int
    signature: str  # base64 Ed25519 over the package statement (shared/agent_packages.py)
    published_at: float
    published_by: str


class PackageList(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[PackageView, ...]
    count: int


class RolloutRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/agent-rollouts`: run `version` on the fleet (or `nodes`), in waves."""

    version: Version
    nodes: Annotated[tuple[NodeId, ...], msgspec.Meta(max_length=MAX_ROLLOUT_NODES)] = ()
    canary_percent: Annotated[float, msgspec.Meta(gt=0, le=100)] = 10.0
    max_failure_share: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.2
    health_timeout_s: Annotated[float, msgspec.Meta(ge=5, le=3600)] = 120.0
    wave_timeout_s: Annotated[float, msgspec.Meta(ge=10, le=86_400)] = 900.0


class RolloutNode(msgspec.Struct, frozen=True, kw_only=True):
    wave: int
    state: NodeUpgradeState
    detail: str = ""
    changed_at: float


class RolloutState(msgspec.Struct, frozen=True, kw_only=True):
    """What the store keeps of a rollout, beside its id, version and phase."""

    rules: RolloutRequest
    waves: int
    current_wave: int  # the highest wave started (0: the canaries)
    wave_started_at: float
    nodes: dict[str, RolloutNode]
    detail: str = ""
    finished_at: float | None = None


class WaveView(msgspec.Struct, frozen=True, kw_only=True):
    wave: int
    nodes: int
    upgraded: int
    failed: int
    upgrading: int
    waiting: int


class RolloutView(msgspec.Struct, frozen=True, kw_only=True):
    rollout_id: str
    version: str
    phase: RolloutPhase
    detail: str
    created_at: float
    created_by: str
    finished_at: float | None
    current_wave: int
    waves: tuple[WaveView, ...]
    counts: dict[str, int]  # node state -> nodes
    nodes: dict[str, RolloutNode]
    rules: RolloutRequest


class RolloutList(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[RolloutView, ...]
    count: int


STATE_DECODER: Final = msgspec.json.Decoder(RolloutState)
