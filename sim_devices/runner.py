"""Runs a simulated fleet: many real agents, one process, one MQTT connection each."""

from __future__ import annotations

import asyncio
import random
import tempfile
from pathlib import Path

from edge.agent import Agent, NodeIdentity
from edge.inference.options import InferenceOptions
from shared.settings import MqttSettings
from sim_devices.fleet import Fleet, expand_fleet
from sim_devices.probes import SimulatedNode
from sim_devices.training import SimulatedLauncher


class SimulatedFleet:
    def __init__(
        self,
        fleet: Fleet,
        mqtt_settings: MqttSettings,
        *,
        telemetry_interval_s: float = 5.0,
        telemetry_jitter_ratio: float = 0.1,
        connects_per_s: float = 200.0,
        model_cache_dir: Path | None = None,
        control_plane_public_key: str = "",
        mqtt_by_node: dict[str, MqttSettings] | None = None,
    ) -> None:
        """`connects_per_s` ramps the fleet up instead of opening every connection at once;
        `control_plane_public_key` (base64) is the key every agent's `desired` documents
        must be signed with (empty: the agents apply none)."""
        self._connect_gap_s = 1.0 / connects_per_s if connects_per_s > 0 else 0.0
        seed_source = random.Random(fleet.seed)
        self.agents: list[Agent] = []
        cache_root = model_cache_dir or Path(tempfile.gettempdir()) / "greenfed-sim-models"
        for spec in expand_fleet(fleet):
            node = SimulatedNode(
                spec.node_id, spec.profile, random.Random(seed_source.getrandbits(64))
            )
            identity = NodeIdentity(
                node_id=spec.node_id,
                site=spec.site,
                zone=spec.zone,
                region=spec.region,
                labels=spec.labels,
                taints=spec.taints,
            )
            launcher = SimulatedLauncher(node.accelerators) if spec.site == "cloud" else None
            self.agents.append(
                Agent(
                    identity,
                    node.probes(),
                    # An enrolled node logs in with its own account.
                    (mqtt_by_node or {}).get(spec.node_id, mqtt_settings),
                    telemetry_interval_s=telemetry_interval_s,
                    telemetry_jitter_ratio=telemetry_jitter_ratio,
                    rng=random.Random(seed_source.getrandbits(64)),
                    training_launcher=launcher,
                    inference=InferenceOptions(
                        cache_dir=cache_root / spec.node_id,
                        latency_scale=spec.profile.inference_latency_scale,
                        # Forty agents share two cores: one thread per model each.
                        intra_op_threads=1,
                    ),
                    control_plane_public_key=control_plane_public_key,
                )
            )

    async def all_announced(self) -> None:
        """Return once every agent has published its first birth."""
        await asyncio.gather(*(agent.announced.wait() for agent in self.agents))

    def connected_count(self) -> int:
        return sum(1 for agent in self.agents if agent.session and agent.session.connected.is_set())

    async def run(self) -> None:
        """Run every agent until cancelled; cancelling stops them all with a goodbye."""
        async with asyncio.TaskGroup() as tasks:
            for agent in self.agents:
                tasks.create_task(agent.run(), name=f"agent-{agent.identity.node_id}")
                if self._connect_gap_s:
                    await asyncio.sleep(self._connect_gap_s)
