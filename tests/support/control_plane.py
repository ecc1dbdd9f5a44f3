"""A control plane (REST + scheduling loop) on the real Mosquitto with a fleet of real
agents on simulated hardware, for end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cloud.loop.signing import load_or_create_signing_key, public_key_base64
from edge.agent import Agent
from edge.agent.birth import ExecutionFacts
from edge.inference.options import InferenceOptions
from edge.training.environment import process_environment
from edge.training.runs import RejectedRun, TrainingRun
from shared.messages import DesiredTraining
from shared.sealing import public_key_text
from shared.settings import CloudSettings, SchedulingSettings, Settings, UsageSettings
from shared.tasks import stop_task
from shared.worker_secrets import open_worker_secrets
from sim_devices.probes import SimulatedNode
from sim_devices.profiles import get_profile
from sim_devices.training import SimulatedLauncher
from tests.api.support import Api, running_api
from tests.store.databases import DatabaseUnderTest
from tests.support.fleet import mqtt_settings, simulated_agent
from tests.support.waiting import eventually_async

FAST_LOOP = SchedulingSettings(
    debounce_s=0.01, interval_s=0.5, node_lost_grace_s=0.3, startup_settle_s=0.0
)


class RecordingLauncher(SimulatedLauncher):
    """The simulated runner, keeping every worker it started with the environment its
    first process would have, secrets opened (the seam a GPU would be). It has a
    sealing key of its own, which its node announces (`execution`)."""

    def __init__(self, node_id: str, profile: str) -> None:
        self.sealing_key = X25519PrivateKey.generate()
        self.inventory = SimulatedNode(node_id, get_profile(profile), random.Random(1)).accelerators
        super().__init__(self.inventory, node_id=node_id, sealing_key=self.sealing_key)
        self.runs: list[tuple[DesiredTraining, dict[str, str], TrainingRun]] = []
        self.execution = ExecutionFacts(
            isolation="sandbox",
            isolation_note="simulated",
            sealing_public_key=public_key_text(self.sealing_key),
        )

    def prepare(self, spec: DesiredTraining) -> TrainingRun:
        run = super().prepare(spec)
        environment: dict[str, str] = {}
        if not isinstance(run, RejectedRun):
            secrets = open_worker_secrets(spec, self.sealing_key, self._node_id)
            environment = process_environment(
                spec,
                self.inventory,
                local=0,
                secret_env=secrets.env,
                work_dir="/work",
                user_name="simulated",
            )
        self.runs.append((spec, environment, run))
        return run


@dataclass
class Fleet:
    api: Api
    agents: dict[str, Agent]
    launchers: dict[str, RecordingLauncher]
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    cache_root: Path | None = None  # models, per node: <cache_root>/<node id>
    simulated: dict[str, SimulatedNode] = field(default_factory=dict)  # by node id
    public_key: str = ""  # the control plane's, as the agents trust it

    async def stop_agent(self, node_id: str) -> None:
        # Cancelled again until it ends: on Python 3.11 a cancellation can be swallowed
        # (shared/tasks.py), and one plain `await task` then waits for ever.
        await stop_task(self.tasks.pop(node_id), timeout_s=10.0)


@contextlib.asynccontextmanager
async def fleet(
    database: DatabaseUnderTest,
    mosquitto_root: tuple[str, str],
    *,
    cloud_nodes: int = 0,
    edge_nodes: int = 0,
    edge_profile: str = "jetson-orin-nano",
    inference: InferenceOptions | None = None,
    cloud_zones: Sequence[tuple[str, str]] = (),
    cloud_profiles: Sequence[str] = (),
    scheduling: SchedulingSettings = FAST_LOOP,
    cloud: CloudSettings | None = None,
    usage: UsageSettings | None = None,
    taints: Mapping[str, tuple[str, ...]] | None = None,
    state_root: Path | None = None,
) -> AsyncIterator[Fleet]:
    """``cloud_zones``: (grid zone, region) of each cloud node in turn (default: all in
    DE, europe-west3); ``cloud_profiles``: the device profile of each in turn (default
    a100-4x; `a100-mig` has MIG slices). The agents trust the control plane's signing
    key, read (or made) before it starts, as `greenfed up` does. ``state_root``: each
    agent keeps its state in ``state_root/<node id>`` (default: in memory)."""
    url, root = mosquitto_root
    settings = mqtt_settings(url, root)
    public_key = control_plane_public_key(database, cloud)
    agents: dict[str, Agent] = {}
    launchers: dict[str, RecordingLauncher] = {}
    simulated: dict[str, SimulatedNode] = {}
    cache_root = Path(tempfile.mkdtemp(prefix="greenfed-test-models-"))
    for index in range(cloud_nodes):
        node_id = f"a100-{index}"
        profile = cloud_profiles[index] if index < len(cloud_profiles) else "a100-4x"
        launchers[node_id] = RecordingLauncher(node_id, profile)
        zone, region = cloud_zones[index] if index < len(cloud_zones) else ("DE", "europe-west3")
        agents[node_id] = simulated_agent(
            node_id,
            settings,
            profile,
            site="cloud",
            zone=zone,
            region=region,
            telemetry_interval_s=0.2,
            training_launcher=launchers[node_id],
            execution=launchers[node_id].execution,
            # Cloud GPUs serve too: inference may share them with training (tidal).
            inference=dataclasses.replace(
                inference or InferenceOptions(), cache_dir=cache_root / node_id
            ),
            control_plane_public_key=public_key,
            state_dir=state_root / node_id if state_root is not None else None,
            simulated_nodes=simulated,
        )
    for index in range(edge_nodes):
        node_id = f"orin-{index}"
        options = dataclasses.replace(
            inference or InferenceOptions(), cache_dir=cache_root / node_id
        )
        agents[node_id] = simulated_agent(
            node_id,
            settings,
            edge_profile,
            telemetry_interval_s=0.2,
            inference=options,
            control_plane_public_key=public_key,
            taints=(taints or {}).get(node_id, ()),
            state_dir=state_root / node_id if state_root is not None else None,
            simulated_nodes=simulated,
        )
    async with running_api(
        database, mqtt=settings, scheduling=scheduling, cloud=cloud, usage=usage
    ) as api:
        running = Fleet(
            api,
            agents,
            launchers,
            cache_root=cache_root,
            public_key=public_key,
            simulated=simulated,
        )
        for node_id, agent in agents.items():
            running.tasks[node_id] = asyncio.create_task(agent.run(), name=node_id)
        try:
            async with asyncio.timeout(15):
                await asyncio.gather(*(agent.announced.wait() for agent in agents.values()))
            yield running
        finally:
            for node_id in list(running.tasks):
                await running.stop_agent(node_id)
            shutil.rmtree(cache_root, ignore_errors=True)


def control_plane_public_key(
    database: DatabaseUnderTest, cloud: CloudSettings | None = None
) -> str:
    """The public key of the control plane `running_api(database, cloud=cloud)` runs."""
    settings = Settings(store=database.settings, cloud=cloud or CloudSettings())
    return public_key_base64(load_or_create_signing_key(settings))


async def work(api: Api, token: str, work_id: str, collection: str = "jobs") -> dict[str, Any]:
    response = await api.get(token, f"/v1/{collection}/{work_id}")
    assert response.status == 200, await response.text()
    body = await response.json()
    assert isinstance(body, dict)
    return body


async def cancel(api: Api, token: str, work_id: str, collection: str = "jobs") -> None:
    """Cancel work over REST (DELETE), which must answer 200."""
    response = await api.client.delete(
        f"/v1/{collection}/{work_id}", headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status == 200, await response.text()


async def reaches(
    api: Api,
    token: str,
    work_id: str,
    state: str,
    *,
    collection: str = "jobs",
    timeout_s: float = 20.0,
) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def there() -> bool:
        seen.update(await work(api, token, work_id, collection))
        return bool(seen["state"] == state)

    await eventually_async(
        there,
        timeout_s=timeout_s,
        interval_s=0.05,
        message=lambda: f"{work_id} is {seen.get('state')} ({seen.get('reason')}), not {state}",
    )
    return seen
