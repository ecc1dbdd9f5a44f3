"""The scheduling loop's step for agent upgrades: each pass, the leader moves the latest
rollout on by what the nodes' births say (cloud/upgrades/rollout.py), saves it, and
knows which nodes' `desired` documents name its version. A node whose entry changes
gets a new generation, so its document goes out again (cloud/loop/loop.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import structlog

from cloud.fleet.registry import NodeRecord
from cloud.models.signing import ModelUrlSigner
from cloud.store import Store
from cloud.store.agent_upgrades import AgentPackageRecord, AgentRolloutRecord
from cloud.upgrades.packages import agent_upgrade
from cloud.upgrades.rollout import advance, asked_nodes
from shared.messages import AgentUpgrade


class UpgradeController:
    def __init__(self, store: Store, signer: ModelUrlSigner) -> None:
        self._store = store
        self._signer = signer
        self._asked: dict[str, AgentUpgrade] = {}
        self._packages: dict[str, AgentPackageRecord] = {}  # immutable, by version
        # After a reset every document goes out anew (the publisher forgot them all), so
        # the first step has nothing to announce.
        self._fresh = True
        # (rollout id, phase) of a rollout that is over, whose asked nodes are known.
        self._settled: tuple[str, str] | None = None
        self._log = structlog.get_logger("greenfed.upgrades")

    def upgrade_for(self, node_id: str) -> AgentUpgrade | None:
        """What `node_id`'s document names (None: nothing: keep the running agent)."""
        return self._asked.get(node_id)

    def reset(self) -> None:
        """Leadership lost: the next leader starts from the store."""
        self._asked = {}
        self._fresh = True
        self._settled = None

    async def step(self, nodes: Mapping[str, NodeRecord], now: float) -> frozenset[str]:
        """Move the latest rollout on; the nodes whose document's agent version changed.

        A rollout that is over and has no node still on its way asks the same nodes for
        the same version until another rollout starts or it is cancelled: its id and
        phase (one small row) say so, and its state (a JSON document of every node's
        entry) is not read again each pass."""
        head = await self._store.latest_agent_rollout_head()
        if head is None:
            asked: dict[str, AgentUpgrade] = {}
        elif head == self._settled:
            asked = self._asked
        else:
            asked = await self._move_on(head[0], nodes, now)
        changed = frozenset(
            node_id
            for node_id in asked.keys() | self._asked.keys()
            if asked.get(node_id) != self._asked.get(node_id)
        )
        self._asked = asked
        if self._fresh:
            self._fresh = False
            return frozenset()
        return changed

    async def _move_on(
        self, rollout_id: str, nodes: Mapping[str, NodeRecord], now: float
    ) -> dict[str, AgentUpgrade]:
        rollout = await self._store.agent_rollout(rollout_id)
        if rollout is None:  # gone since its head was read (a restore): nothing is asked
            return {}
        phase, state = rollout.phase, rollout.state
        on_their_way = any(n.state == "upgrading" for n in state.nodes.values())
        if phase == "running" or (phase == "halted" and on_their_way):
            moved = await self._moved_on(rollout, nodes, now)
            if moved is None:
                return {}
            rollout, phase, state = moved, moved.phase, moved.state
            on_their_way = any(n.state == "upgrading" for n in state.nodes.values())
        settled = phase != "running" and not on_their_way
        self._settled = (rollout.rollout_id, phase) if settled else None
        package = await self._package(rollout.version)
        if package is None:
            return {}
        # One document entry for every asked node: the same version, URL and signature.
        upgrade = agent_upgrade(
            package,
            self._signer,
            rollout_id=rollout.rollout_id,
            health_timeout_s=state.rules.health_timeout_s,
        )
        return dict.fromkeys(asked_nodes(phase, state), upgrade)

    async def _moved_on(
        self, rollout: AgentRolloutRecord, nodes: Mapping[str, NodeRecord], now: float
    ) -> AgentRolloutRecord | None:
        """The rollout moved on by what the nodes' births say, and saved. If it left the
        phase it was read in meanwhile (an admin cancelled it), that stands: the rollout
        as the store has it now (None: gone), which the next pass goes on from."""
        phase, state = advance(
            rollout.rollout_id, rollout.version, rollout.phase, rollout.state, nodes, now
        )
        if (phase, state) == (rollout.phase, rollout.state):
            return rollout
        saved = await self._store.save_agent_rollout(
            rollout.rollout_id, phase, state, from_phase=rollout.phase
        )
        if not saved:
            return await self._store.agent_rollout(rollout.rollout_id)
        if (phase, state.current_wave) != (rollout.phase, rollout.state.current_wave):
            self._log.info(
                "agent rollout moved",
                rollout_id=rollout.rollout_id,
                version=rollout.version,
                phase=phase,
                wave=state.current_wave,
                detail=state.detail,
            )
        return dataclasses.replace(rollout, phase=phase, state=state)

    async def _package(self, version: str) -> AgentPackageRecord | None:
        if version not in self._packages:
            record = await self._store.agent_package(version)
            if record is None:
                return None
            self._packages[version] = record
        return self._packages[version]
