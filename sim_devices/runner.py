"""Runs a simulated fleet: many real agents, one process, one MQTT connection each.

A large fleet is split over several processes (`greenfed sim --processes N`,
sim_devices/processes.py): each runs one shard of the same fleet file, node i in
shard i mod N, so every shard is as heterogeneous as the whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from edge.agent import Agent, NodeIdentity
from edge.agent.birth import ExecutionFacts
from edge.inference.options import InferenceOptions
from edge.training.runs import LauncherFactory
from shared.sealing import public_key_text
from shared.settings import MqttSettings
from shared.tasks import cancel_and_wait
from sim_devices.fleet import Fleet, expand_fleet
from sim_devices.probes import SimulatedNode
from sim_devices.training import SIMULATED_ISOLATION, SIMULATED_RUNTIMES, SimulatedLauncher

# How long a stopping fleet's agents are cancelled again until they end: thousands of
# agents' goodbyes on a busy machine have taken over a minute (sim_devices/processes.py
# waits 180 s for a child).
STOP_BUDGET_S = 150.0


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard `index` of `count` (from 0): the fleet's nodes i with i mod count == index."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index} of {self.count}: must be in 0..{self.count - 1}")

    def holds(self, node_index: int) -> bool:
        return node_index % self.count == self.index


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
        shard: Shard | None = None,
    ) -> None:
        """`connects_per_s` ramps the fleet up instead of opening every connection at once;
        `control_plane_public_key` (base64) is the key every agent's `desired` documents
        must be signed with (empty: the agents apply none); `shard`: run only that
        shard's nodes, each with the same randomness as in the whole fleet."""
        self._connect_gap_s = 1.0 / connects_per_s if connects_per_s > 0 else 0.0
        seed_source = random.Random(fleet.seed)
        self.agents: list[Agent] = []
        self.stopped = asyncio.Event()  # set while no agent runs (`run`)
        self.stopped.set()
        # Each training node's sealing key (public halves: what it enrols with).
        self.sealing_public_keys: dict[str, str] = {}
        cache_root = model_cache_dir or Path(tempfile.gettempdir()) / "greenfed-sim-models"
        for index, spec in enumerate(expand_fleet(fleet)):
            # Drawn for every node, so a node is the same whichever shard runs it.
            node_seed, agent_seed = seed_source.getrandbits(64), seed_source.getrandbits(64)
            if shard is not None and not shard.holds(index):
                continue
            node = SimulatedNode(spec.node_id, spec.profile, random.Random(node_seed))
            identity = NodeIdentity(
                node_id=spec.node_id,
                site=spec.site,
                zone=spec.zone,
                region=spec.region,
                labels=spec.labels,
                taints=spec.taints,
            )
            launcher: LauncherFactory | None = None
            execution = ExecutionFacts()
            if spec.site == "cloud":
                key = X25519PrivateKey.generate()
                launcher = _simulated_launcher(node, spec.node_id, key)
                execution = ExecutionFacts(
                    isolation=SIMULATED_ISOLATION,
                    isolation_note="simulated node",
                    resource_limits=("memory", "cpu", "pids"),
                    container_runtimes=SIMULATED_RUNTIMES,
                    sealing_public_key=public_key_text(key),
                )
                self.sealing_public_keys[spec.node_id] = public_key_text(key)
            self.agents.append(
                Agent(
                    identity,
                    node.probes(),
                    # An enrolled node logs in with its own account.
                    (mqtt_by_node or {}).get(spec.node_id, mqtt_settings),
                    telemetry_interval_s=telemetry_interval_s,
                    telemetry_jitter_ratio=telemetry_jitter_ratio,
                    rng=random.Random(agent_seed),
                    training_launcher=launcher,
                    inference=InferenceOptions(
                        cache_dir=cache_root / spec.node_id,
                        latency_scale=spec.profile.inference_latency_scale,
                        # Forty agents share two cores: one thread per model each.
                        intra_op_threads=1,
                    ),
                    control_plane_public_key=control_plane_public_key,
                    execution=execution,
                )
            )

    async def all_announced(self) -> None:
        """Return once every agent has published its first birth."""
        await asyncio.gather(*(agent.announced.wait() for agent in self.agents))

    def telemetry_sent(self) -> int:
        return sum(agent.counters.telemetry_sent for agent in self.agents)

    def connected_count(self) -> int:
        return sum(1 for agent in self.agents if agent.session and agent.session.connected.is_set())

    async def run(self) -> None:
        """Run every agent until cancelled; cancelling stops them all with a goodbye.
        `stopped` is set once every agent has ended (their counts are final then). A
        fleet of no agents runs until cancelled too: returning at once would end what
        it runs beside (`greenfed up --sim 0` serves a broker and a control plane for
        real nodes alone)."""
        self.stopped.clear()
        try:
            async with asyncio.TaskGroup() as tasks:
                agents: list[asyncio.Task[None]] = []
                try:
                    for agent in self.agents:
                        agents.append(
                            tasks.create_task(agent.run(), name=f"agent-{agent.identity.node_id}")
                        )
                        if self._connect_gap_s:
                            await asyncio.sleep(self._connect_gap_s)
                    if agents:
                        await asyncio.wait(agents)
                    else:
                        await asyncio.Event().wait()  # nothing to run: until cancelled
                finally:
                    await _stop(agents)
        finally:
            self.stopped.set()


async def _stop(agents: list[asyncio.Task[None]]) -> None:
    """Cancel the agents until every one has ended, for at most `STOP_BUDGET_S`: a task
    group cancels its tasks once, and an agent whose cancellation aiomqtt's wait_for
    dropped (Python 3.11, shared/tasks.py) would run on, sending telemetry after its
    fleet said how much it sent, and keep its process from exiting. Our owner's own
    repeated cancellations (shared/tasks.py) ask for what is under way already."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STOP_BUDGET_S
    pending = {agent for agent in agents if not agent.done()}
    while pending and loop.time() < deadline:
        # Cancelled itself meanwhile, it goes on: stopping the agents is what was asked.
        with contextlib.suppress(asyncio.CancelledError):
            await cancel_and_wait(pending, deadline - loop.time())
        pending = {agent for agent in pending if not agent.done()}


def _simulated_launcher(
    node: SimulatedNode, node_id: str, key: X25519PrivateKey
) -> LauncherFactory:
    return lambda inventory: SimulatedLauncher(node.accelerators, node_id=node_id, sealing_key=key)
