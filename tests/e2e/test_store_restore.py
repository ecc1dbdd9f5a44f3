"""The restore drill of docs/operations.md under a live fleet: a control plane with
enrolled agents on the real Mosquitto runs work and queues more; `greenfed store backup`
is taken while it runs; it goes on working (a job placed, cancelled, another placed),
then stops for good. `greenfed store restore` fills an empty database, the key files
are put back, and a new control plane starts on it.

The fleet must come back to it as it was at the backup: every node admitted and online
(enrolment comes with the store), every job acknowledged before the backup there once,
the running ones adopted where they run (their workers were started once, by the old
control plane, and the new one still stops them), the queued one placed and started,
and what ran only because of the lost control plane's later decisions stopped rather
than left running unseen.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from cloud.app_keys import REGISTRY
from edge.agent import Agent
from edge.training.runs import TrainingRun
from greenfed.cli import main
from shared.settings import CloudSettings, MqttSettings, StoreSettings
from shared.tasks import stop_task
from tests.api.support import Api, bearer, running_api
from tests.store.databases import DatabaseUnderTest, postgres_database, sqlite_database
from tests.support.control_plane import FAST_LOOP, RecordingLauncher, reaches, work
from tests.support.enrolled_fleet import cloud_agent, enrol, join_token
from tests.support.fleet import mqtt_settings
from tests.support.waiting import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

NODES = ("a100-0", "a100-1", "a100-2")
# Grace long enough that the restored control plane's first passes, before every retained
# birth is in, lose no node; a short settle so the test does not wait for it long.
SCHEDULING = msgspec.structs.replace(FAST_LOOP, node_lost_grace_s=5.0, startup_settle_s=0.3)
CLOUD = CloudSettings(invalid_log_interval_s=0, require_enrolment=True)
# What a restore needs beside the database (docs/operations.md): the keys and the admin's
# token (models and broker accounts are not used here).
COMPANIONS = ("secrets.key", "desired-signing.key", "admin-token")


SECRET = "plain-text-that-must-not-leak"
# Never placed: no node has this label.
WAITING = {"name": "waiting", "command": ["true"], "node_selector": {"pool": "none"}}


def job(
    name: str, *, priority: str = "p1", workers: int = 1, hours: float = 10.0
) -> dict[str, object]:
    return {
        "name": name,
        "command": ["python", "train.py"],
        "priority": priority,
        "workers": workers,
        "accelerators_per_worker": 4,
        "estimated_duration_s": hours * 3600,  # the simulated worker runs this long
    }


class Fleet:
    """Enrolled simulated agents that outlive the control planes they report to."""

    def __init__(self, mqtt: MqttSettings) -> None:
        self.mqtt = mqtt
        self.launchers = {node_id: RecordingLauncher(node_id, "a100-4x") for node_id in NODES}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    async def start(self, public_key: str) -> None:
        agents: list[Agent] = []
        for node_id, launcher in self.launchers.items():
            agent = cloud_agent(node_id, self.mqtt, public_key, launcher)
            agents.append(agent)
            self.tasks[node_id] = asyncio.create_task(agent.run(), name=node_id)
        async with asyncio.timeout(15):
            await asyncio.gather(*(agent.announced.wait() for agent in agents))

    async def stop(self) -> None:
        for node_id in list(self.tasks):
            await stop_task(self.tasks.pop(node_id), timeout_s=10.0)

    def starts(self, job_id: str) -> list[tuple[str, int]]:
        """(node, rank) of every worker of the job any node started."""
        return [
            (node_id, spec.rank)
            for node_id, launcher in self.launchers.items()
            for spec, _, _ in launcher.runs
            if spec.job_id == job_id
        ]

    def run_of(self, job_id: str) -> TrainingRun:
        (run,) = [
            run
            for launcher in self.launchers.values()
            for spec, _, run in launcher.runs
            if spec.job_id == job_id
        ]
        return run


def finished(run: TrainingRun) -> bool:
    return run.status.finished


@contextlib.asynccontextmanager
async def empty_database_like(
    database: DatabaseUnderTest, tmp_path: Path
) -> AsyncIterator[DatabaseUnderTest]:
    """Another database of the same kind, with a data directory of its own: the machine
    the store is restored on."""
    if database.kind == "sqlite":
        yield sqlite_database(tmp_path / "restored")
        return
    async with postgres_database(tmp_path / "restored") as restored:
        yield restored


def put_back(old_data_dir: Path, new_data_dir: Path) -> None:
    """The files a backup does not hold, from where the operator keeps them."""
    new_data_dir.mkdir(parents=True, exist_ok=True)
    for name in COMPANIONS:
        shutil.copy2(old_data_dir / name, new_data_dir / name)


def config_file(settings: StoreSettings, path: Path) -> Path:
    """A settings file whose [store] section names `settings`' database (the CLI's)."""
    lines = ["[store]", f'data_dir = "{settings.data_dir}"']
    if settings.database_url:
        lines.append(f'database_url = "{settings.database_url}"')
    if settings.database_schema:
        lines.append(f'database_schema = "{settings.database_schema}"')
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


async def greenfed(*argv: str) -> int:
    """The real command line, in a thread (it runs its own event loop)."""
    return await asyncio.to_thread(main, list(argv))


async def all_online(api: Api) -> None:
    registry = api.app[REGISTRY]

    def online() -> bool:
        return all((r := registry.get(n)) is not None and r.state == "online" for n in NODES)

    await eventually(online, timeout_s=15, message=lambda: f"nodes: {registry.nodes()}")


async def job_ids(api: Api, token: str) -> list[str]:
    response = await api.client.get("/v1/jobs?limit=200", headers=bearer(token))
    assert response.status == 200, await response.text()
    return [item["id"] for item in (await response.json())["items"]]


async def test_a_restored_store_takes_its_running_fleet_back(
    database: DatabaseUnderTest,
    mosquitto_root: tuple[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, root = mosquitto_root
    fleet = Fleet(mqtt_settings(url, root))
    backup = tmp_path / "greenfed.backup"
    try:
        async with running_api(
            database, mqtt=fleet.mqtt, scheduling=SCHEDULING, cloud=CLOUD
        ) as old:
            enrolment = await join_token(old, uses=len(NODES))
            keys = {(await enrol(old, enrolment, n))["control_plane_public_key"] for n in NODES}
            (public_key,) = keys  # the control plane's, as each enrolment hands it out
            await fleet.start(public_key)
            await all_online(old)
            token = await old.tenant("acme")
            running = [await old.submitted(token, job(f"long-{i}")) for i in range(2)]
            busy = {(await reaches(old, token, r, "running"))["nodes"][0] for r in running}
            (free,) = set(NODES) - busy
            # A gang of two whole nodes, lower priority: one node is free, so it waits.
            queued = await old.submitted(token, job("gang", priority="p2", workers=2))
            await reaches(old, token, queued, "pending")

            # The backup is taken while another tenant submits: it holds a prefix of those
            # submissions, each once (they wait for a node labelled as none is).
            other = await old.tenant("other")
            before_backup = [await old.submitted(other, WAITING) for _ in range(2)]
            with_secret = {**WAITING, "secret_env": {"API_KEY": SECRET}}
            before_backup.append(await old.submitted(other, with_secret))
            during_backup: list[str] = []

            async def submitting(until: asyncio.Event) -> None:
                while not until.is_set():
                    during_backup.append(await old.submitted(other, WAITING))

            backed_up = asyncio.Event()
            submitter = asyncio.create_task(submitting(backed_up))
            try:
                old_config = config_file(database.settings, tmp_path / "old.toml")
                code = await greenfed("store", "backup", "--config", str(old_config), str(backup))
            finally:
                backed_up.set()
                await submitter
            assert code == 0
            assert during_backup  # the first was under way before the backup began
            content = gzip.decompress(backup.read_bytes())
            assert SECRET.encode() not in content  # at rest in the backup as in the store
            assert b"gfenc1:" in content
            said = capsys.readouterr().out
            assert "NOT in the backup" in said
            assert "cloud.secrets_key_file" in said
            assert "cloud.signing_key_file" in said

            # The old control plane goes on after the backup: decisions the backup never
            # saw, on the free node (its desired generation moves past the backup's).
            cancelled = await old.submitted(token, job("later-cancelled", hours=0.1))
            await reaches(old, token, cancelled, "running")
            response = await old.client.delete(f"/v1/jobs/{cancelled}", headers=bearer(token))
            assert response.status in (200, 202), await response.text()
            await eventually(lambda: finished(fleet.run_of(cancelled)), timeout_s=10)
            unseen = await old.submitted(token, job("after-the-backup", hours=0.1))
            await reaches(old, token, unseen, "running")
            assert fleet.starts(unseen) == [(free, 0)]
        # The old control plane is gone for good; its agents keep running their work.

        async with empty_database_like(database, tmp_path) as restored:
            put_back(Path(database.settings.data_dir), Path(restored.settings.data_dir))
            config = config_file(restored.settings, tmp_path / "new.toml")
            assert await greenfed("store", "restore", "--config", str(config), str(backup)) == 0
            said = capsys.readouterr().out
            assert "put these back" in said
            for line in said.splitlines():  # the keys are back where the settings say
                if line.strip().startswith(("secrets key", "signing key", "admin token")):
                    assert "MISSING" not in line

            async with running_api(
                restored, mqtt=fleet.mqtt, scheduling=SCHEDULING, cloud=CLOUD
            ) as new:
                await all_online(new)  # admitted: their enrolment came back with the store
                assert sorted(await job_ids(new, token)) == sorted([*running, queued])
                others = await job_ids(new, other)
                assert len(others) == len(set(others))
                assert set(before_backup) <= set(others) <= {*before_backup, *during_backup}
                for job_id in running:  # adopted where they run, never started again
                    body = await reaches(new, token, job_id, "running")
                    assert body["attempts"] == 1
                    assert len(fleet.starts(job_id)) == 1
                    assert not finished(fleet.run_of(job_id))
                # What the backup never knew of is stopped, not left running unseen.
                await eventually(
                    lambda: finished(fleet.run_of(unseen)),
                    timeout_s=15,
                    message="the unknown job still runs",
                )

                assert (await work(new, token, queued))["state"] == "pending"  # no room yet

                # The adopted work is the new control plane's to stop, and the queued gang
                # runs in the room that leaves.
                response = await new.client.delete(f"/v1/jobs/{running[0]}", headers=bearer(token))
                assert response.status in (200, 202), await response.text()
                await eventually(lambda: finished(fleet.run_of(running[0])), timeout_s=10)
                await reaches(new, token, queued, "running", timeout_s=20)
                assert sorted(rank for _, rank in fleet.starts(queued)) == [0, 1]
                assert sorted(await job_ids(new, token)) == sorted([*running, queued])
    finally:
        await fleet.stop()
