"""Keeping what admins set on nodes (cloud/fleet/node_overlay.py) fresh on every replica
of the control plane: reloaded from the store every few seconds, and applied at once by
the replica that changed it. The same round records what an enrolled node first
claimed, as what it is approved as (cloud/fleet/envelope.py), and, while a node drains,
reloads what its drain waits for as the scheduling leader stored it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

import structlog

from cloud.fleet.envelope import NodeClaim, claim_of
from cloud.fleet.registry import NodeRegistry
from cloud.store import NodeAdminRecord, Store, StoreUnavailableError


@dataclass(slots=True)
class StoredDrainWaiting:
    """Why draining nodes' drains wait, as the scheduling leader last stored it
    (cloud/store/drain_waiting.py): what a replica that does not lead shows with its
    nodes (the leader shows its latest pass's own)."""

    by_node: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


async def refresh_forever(
    registry: NodeRegistry,
    store: Store,
    *,
    interval_s: float = 2.0,
    drain_waiting: StoredDrainWaiting | None = None,
) -> None:
    """Reload the admins' settings into `registry` every `interval_s`, and into
    `drain_waiting` what drains wait for (read only while some node drains)."""
    log = structlog.get_logger("greenfed.node_admin")
    unclaimed = FirstClaims(registry)
    while True:
        try:
            refreshed(registry, await store.node_admin())
            claims = unclaimed.claims()
            if claims:
                await store.set_first_claims(claims)
                refreshed(registry, await store.node_admin())
            if drain_waiting is not None:
                draining = any(record.draining for record in registry.admin.values())
                drain_waiting.by_node = await store.drain_waiting() if draining else {}
        except StoreUnavailableError as error:
            log.warning("node settings not refreshed: store unavailable", error=str(error))
        await asyncio.sleep(interval_s)


def refreshed(registry: NodeRegistry, admin: Mapping[str, NodeAdminRecord]) -> bool:
    """`NodeRegistry.set_admin` unless the settings are those it holds (each node's
    record holds its node's entry of `registry.admin`): a look at each admin record, not
    at each node, in the common round where no admin changed anything. Whether a known
    node changed."""
    if admin == registry.admin:
        return False
    return registry.set_admin(admin)


class FirstClaims:
    """`first_claims` of a registry, walked again only when the registry's version moved
    since the last walk: every input of a claim (a node's state, birth, settings,
    approval and envelope) changes with it (a new envelope through
    `NodeRegistry.judge_again`). At 10,000 nodes the walk is several ms, every 2 s, on
    the event loop; most rounds nothing moved."""

    def __init__(self, registry: NodeRegistry) -> None:
        self._registry = registry
        self._version: int | None = None
        self._claims: dict[str, NodeClaim] = {}
        self.walks = 0  # full walks made (for tests and benchmarks)

    def claims(self) -> dict[str, NodeClaim]:
        """What `first_claims(registry)` returns now (a copy the caller may keep)."""
        registry = self._registry
        if self._version != registry.version:
            self._claims = first_claims(registry)
            self._version = registry.version
            self.walks += 1
        return dict(self._claims)


def first_claims(registry: NodeRegistry) -> dict[str, NodeClaim]:
    """What online enrolled nodes with nothing approved yet claim: their first birth
    (within their envelope) sets what they may be from now on."""
    claims = {}
    for record in registry:
        envelope = registry.envelope_of(record.node_id)
        if envelope is None or record.awaiting_approval:
            continue
        if record.state != "online" or (
            record.admin is not None and record.admin.approved is not None
        ):
            continue
        claims[record.node_id] = claim_of(record.status)
    return claims


def apply_one(registry: NodeRegistry, record: NodeAdminRecord) -> bool:
    """Apply one node's new settings now; whether a known node changed."""
    current = dict(registry.admin)
    current[record.node_id] = record
    return registry.set_admin(current)
