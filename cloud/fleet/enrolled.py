"""Which node ids ingestion admits: enrolled and unrevoked ones (when
`cloud.require_enrolment`), never a revoked one; the sealing key each enrolled node
was pinned to (the key its births must announce to receive secrets, cloud/fleet/ingest.py);
and what each may be (its `NodeEnvelope`, that the registry holds its births to).

Ingestion is synchronous and runs for every message, so the answer comes from memory,
never from the database: loaded at start, changed at once by this process's enrolments
and revocations, and reloaded every few seconds so that the API replicas agree with each
other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

import structlog

from cloud.fleet.envelope import NodeEnvelope

REFRESH_INTERVAL_S: Final = 3.0


@dataclass(frozen=True, slots=True)
class EnrolledIds:
    """One reading of the store: active (enrolled, unrevoked) and revoked node ids, the
    sealing keys active nodes are pinned to (node id -> base64 public key), and what
    active nodes may be (those enrolled before envelopes were kept have none)."""

    active: frozenset[str]
    revoked: frozenset[str]
    sealing_keys: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    envelopes: Mapping[str, NodeEnvelope] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Changes:
    """What a reload changed: ids no longer admitted, nodes whose envelope changed, ids
    enrolled since the last reading (another replica enrolled or re-admitted them)."""

    refused: set[str]
    envelopes: set[str]
    admitted: set[str] = field(default_factory=set)


class EnrolledNodes:
    def __init__(self, *, required: bool) -> None:
        self.required = required
        self._active: set[str] = set()
        self._revoked: set[str] = set()
        self._sealing_keys: dict[str, str] = {}
        self._envelopes: dict[str, NodeEnvelope] = {}
        self._local_changes = 0  # bumped by enrolled()/revoked(): a reload in flight is stale
        self._log = structlog.get_logger("greenfed.enrolment")

    def admits(self, node_id: str) -> bool:
        """May a message from this node id be ingested? (Cheap: two set lookups.)"""
        if node_id in self._revoked:
            return False
        return not self.required or node_id in self._active

    def is_revoked(self, node_id: str) -> bool:
        return node_id in self._revoked

    def pinned_sealing_key(self, node_id: str) -> str | None:
        """The sealing key the node enrolled with; None: none pinned (trust its birth's)."""
        return self._sealing_keys.get(node_id)

    def envelope(self, node_id: str) -> NodeEnvelope | None:
        """What the node may be, as it enrolled; None: not held (not enrolled, or
        enrolled before envelopes were kept)."""
        return self._envelopes.get(node_id)

    def enrolled(
        self,
        node_id: str,
        sealing_public_key: str | None = None,
        envelope: NodeEnvelope | None = None,
    ) -> None:
        """The node (re-)enrolled, pinned to this sealing key (None: to none), held to
        this envelope (None: to none)."""
        self._local_changes += 1
        self._active.add(node_id)
        self._revoked.discard(node_id)
        self._sealing_keys.pop(node_id, None)
        self._envelopes.pop(node_id, None)
        if sealing_public_key is not None:
            self._sealing_keys[node_id] = sealing_public_key
        if envelope is not None:
            self._envelopes[node_id] = envelope

    def revoked(self, node_id: str) -> None:
        self._local_changes += 1
        self._active.discard(node_id)
        self._revoked.add(node_id)
        self._sealing_keys.pop(node_id, None)
        self._envelopes.pop(node_id, None)

    def replace(self, ids: EnrolledIds) -> Changes:
        """Adopt a reading of the store: which ids are admitted no longer, and which
        nodes' envelopes changed."""
        before = {node_id for node_id in self._active | self._revoked if self.admits(node_id)}
        envelopes_before = self._envelopes
        active_before = self._active
        self._active = set(ids.active)
        self._revoked = set(ids.revoked)
        self._sealing_keys = dict(ids.sealing_keys)
        self._envelopes = dict(ids.envelopes)
        return Changes(
            refused={node_id for node_id in before if not self.admits(node_id)},
            envelopes={
                node_id
                for node_id in envelopes_before.keys() | self._envelopes.keys()
                if envelopes_before.get(node_id) != self._envelopes.get(node_id)
            },
            admitted=self._active - active_before,
        )

    async def reload(self, load: Callable[[], Awaitable[EnrolledIds]]) -> Changes | None:
        """Load and adopt; None (nothing adopted) when this process enrolled or revoked
        a node while the reading was in flight: the next reload is current."""
        changes = self._local_changes
        ids = await load()
        if changes != self._local_changes:
            return None
        return self.replace(ids)

    async def refresh_forever(
        self,
        load: Callable[[], Awaitable[EnrolledIds]],
        on_change: Callable[[Changes], None],
        interval_s: float = REFRESH_INTERVAL_S,
    ) -> None:
        """Reload every `interval_s` (another replica may have enrolled or revoked);
        `on_change` hears of ids no longer admitted (to drop them from the registry), of
        changed envelopes (to judge those nodes again) and of ids enrolled elsewhere."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                changes = await self.reload(load)
            except Exception as error:  # the store is briefly away: keep the last reading
                self._log.warning("enrolled nodes not reloaded", error=str(error)[:300])
                continue
            if changes is not None and (changes.refused or changes.envelopes or changes.admitted):
                on_change(changes)
