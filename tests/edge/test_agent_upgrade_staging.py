"""The agent's side of an upgrade (edge/agent/upgrades.py): a `desired` document names a
version, the agent fetches the package from a real HTTP server, checks it and stages it
on trial, naming the version to go back to if it fails: the one that runs now."""

from __future__ import annotations

import asyncio
import os
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from edge.agent.context import AgentContext, AgentCounters, NodeIdentity
from edge.agent.upgrades import AgentUpgrades, UpgradeOptions
from edge.upgrade.versions import Trial, VersionsDir
from shared import __version__
from shared.agent_packages import PackageFacts, sign_package, unpack_wheel
from shared.ed25519 import VerifyKey
from shared.file_digests import file_sha256
from shared.messages import AgentUpgrade
from shared.topics import Topics

pytestmark = pytest.mark.timeout(30)

NEW = "2.0"


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The unit's files are made under a umask that writes for no group (0027)."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def greenfed_wheel(path: Path, version: str) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("greenfed/__init__.py", "")
        archive.writestr(
            f"greenfed-{version}.dist-info/METADATA", f"Name: greenfed\nVersion: {version}\n"
        )
    return path


async def staged_trial(tmp_path: Path, versions: VersionsDir) -> Trial:
    """Offer the agent (run by a supervisor, `versions` its directory) a signed package
    of `NEW`; the trial it staged once it asks to be started again."""
    assert __version__ != NEW
    key = Ed25519PrivateKey.generate()
    wheel = greenfed_wheel(tmp_path / f"greenfed-{NEW}-py3-none-any.whl", NEW)
    sha256, size_bytes = file_sha256(wheel)

    async def serve_wheel(_request: web.Request) -> web.FileResponse:
        return web.FileResponse(wheel)

    app = web.Application()
    app.router.add_get("/wheel", serve_wheel)
    restart_requested, report_changed, announced = asyncio.Event(), asyncio.Event(), asyncio.Event()
    context = AgentContext(
        identity=NodeIdentity(node_id="pi-1", site="edge", zone="DE", region="eu"),
        instance_id="instance-1",
        topics=Topics("gftest-upgrade"),
        counters=AgentCounters(),
        wall_clock=time.time,
        log=structlog.get_logger("test"),
    )
    upgrades = AgentUpgrades(
        context,
        UpgradeOptions(
            versions_dir=versions.root,
            health_file=tmp_path / "health",
            request_restart=restart_requested.set,
        ),
        public_key=VerifyKey(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)),
        announced=announced,
        report_changed=report_changed,
    )
    async with TestServer(app, host="127.0.0.1") as server, asyncio.TaskGroup() as work:
        await upgrades.start(work)
        upgrades.offer(
            AgentUpgrade(
                version=NEW,
                rollout_id="r2",
                url=str(server.make_url("/wheel")),
                sha256=sha256,
                size_bytes=size_bytes,
                signature=sign_package(PackageFacts(NEW, sha256, size_bytes), key),
                health_timeout_s=30,
            )
        )
        # Staged (a restart asked for), or failed (the birth's report changed).
        async with asyncio.TaskGroup() as outcome:
            staged = outcome.create_task(restart_requested.wait())
            refused = outcome.create_task(report_changed.wait())
            await asyncio.wait((staged, refused), return_when=asyncio.FIRST_COMPLETED)
            staged.cancel()
            refused.cancel()
        assert upgrades.report() is None
        announced.set()  # its health-file task ends, and with it the agent's work here
    trial = versions.trial()
    assert trial is not None
    return trial


async def test_an_installed_agent_whose_active_record_names_the_new_version_goes_back_to_itself(
    tmp_path: Path,
) -> None:
    """`active.json` names 2.0, whose files the supervisor could not trust, so it runs
    the installed agent; asked for 2.0 again, that agent stages it. Should 2.0 fail its
    trial, the version to go back to is the installed one that ran, never 2.0 itself."""
    versions = VersionsDir(tmp_path / "agent-versions")
    unpack_wheel(greenfed_wheel(tmp_path / "old.whl", NEW), versions.site(NEW))
    versions.set_active(NEW, "r1")
    trial = await staged_trial(tmp_path, versions)
    assert (trial.version, trial.rollout_id) == (NEW, "r2")
    assert trial.previous is None


async def test_an_agent_running_an_upgraded_version_goes_back_to_that_version(
    tmp_path: Path,
) -> None:
    versions = VersionsDir(tmp_path / "agent-versions")
    unpack_wheel(greenfed_wheel(tmp_path / "running.whl", __version__), versions.site(__version__))
    versions.set_active(__version__, "r1")
    trial = await staged_trial(tmp_path, versions)
    assert trial.previous == __version__
