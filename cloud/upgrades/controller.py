"""The scheduling loop's step for agent upgrades: each pass, the leader moves the latest
rollout on by what the nodes' births say (cloud/upgrades/rollout.py), saves it, and
knows which nodes' `desired` documents name its version. A node whose entry changes
gets a new generation, so its document goes out again (cloud/loop/loop.py)."""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from cloud.fleet.registry import NodeRecord
from cloud.models.signing import ModelUrlSigner
from cloud.store import Store
from cloud.store.agent_upgrades import AgentPackageRecord
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
        self._log = structlog.get_logger("greenfed.upgrades")

    def upgrade_for(self, node_id: str) -> AgentUpgrade | None:
        """What `node_id`'s document names (None: nothing: keep the running agent)."""
        return self._asked.get(node_id)

    def reset(self) -> None:
        """Leadership lost: the next leader starts from the store."""
        self._asked = {}
        self._fresh = True

    async def step(self, nodes: Mapping[str, NodeRecord], now: float) -> frozenset[str]:
        """Move the latest rollout on; the nodes whose document's agent version changed."""
        latest = await self._store.list_agent_rollouts(limit=1)
        asked: dict[str, AgentUpgrade] = {}
        if latest:
            rollout = latest[0]
            phase, state = rollout.phase, rollout.state
            if phase == "running" or (
                phase == "halted" and any(n.state == "upgrading" for n in state.nodes.values())
            ):
                phase, state = advance(
                    rollout.rollout_id, rollout.version, phase, state, nodes, now
                )
                if (phase, state) != (rollout.phase, rollout.state):
                    await self._store.save_agent_rollout(rollout.rollout_id, phase, state)
                    if (phase, state.current_wave) != (rollout.phase, rollout.state.current_wave):
                        self._log.info(
                            "agent rollout moved",
                            rollout_id=rollout.rollout_id,
                            version=rollout.version,
                            phase=phase,
                            wave=state.current_wave,
                            detail=state.detail,
                        )
            package = await self._package(rollout.version)
            if package is not None:
                for node_id in asked_nodes(phase, state):
                    asked[node_id] = agent_upgrade(
                        package,
                        self._signer,
                        rollout_id=rollout.rollout_id,
                        health_timeout_s=state.rules.health_timeout_s,
                    )
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

    async def _package(self, version: str) -> AgentPackageRecord | None:
        if version not in self._packages:
            record = await self._store.agent_package(version)
            if record is None:
                return None
            self._packages[version] = record
        return self._packages[version]
