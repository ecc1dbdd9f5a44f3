"""The agent's side of an upgrade over the air: a `desired` document names an agent
version (`agent_upgrade`, 1.11); this module fetches the package the control plane
serves, checks its size, sha256 and signature (the control plane's key, the one every
`desired` document is checked with), unpacks it beside the running version
(edge/upgrade/versions.py), puts it on trial and asks to be started again. The
supervisor (edge/upgrade/supervisor.py) starts the new version and rolls it back if it
does not announce itself in time; the version that runs after a rollback reports it in
its birth (`agent_upgrade`), and never tries that version again.

An agent that no supervisor runs (a simulated fleet, `--no-supervise`) says so in its
birth (`self_upgrade` false) and ignores upgrades: nothing could roll it back.

Training workers and serving replicas are not touched: they outlive agent restarts
(edge/training/process.py), and the new version takes them back as any restart does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from edge.agent.context import AgentContext
from edge.agent.module import AgentModule
from edge.upgrade.versions import Failure, Trial, VersionsDir
from shared import __version__
from shared.agent_packages import (
    PackageError,
    PackageFacts,
    inspect_wheel,
    unpack_wheel,
    verify_package_signature,
)
from shared.file_digests import file_sha256
from shared.messages import AgentUpgrade, AgentUpgradeReport

if TYPE_CHECKING:
    import aiohttp

    from shared.ed25519 import VerifyKey

DOWNLOAD_ATTEMPTS: Final = 3
DOWNLOAD_TIMEOUT_S: Final = 300.0
_RETRY_PAUSE_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class UpgradeOptions:
    """How a supervised agent upgrades: where its versions live, the file it writes once
    it has announced itself, and how it asks to be started again."""

    versions_dir: Path
    health_file: Path
    request_restart: Callable[[], None]


def _running_version(versions: VersionsDir, trial_version: str) -> str | None:
    """The version a failed trial of `trial_version` goes back to: this one, the version
    that runs (None: the installed one). Not `active.json`'s: it can name a version the
    supervisor did not run (its files could not be trusted, so the installed one runs),
    even the version now on trial, which a rollback would then start again."""
    if __version__ == trial_version or not versions.is_installed(__version__):
        return None
    return __version__


class AgentUpgrades(AgentModule):
    name = "upgrades"

    def __init__(
        self,
        context: AgentContext,
        options: UpgradeOptions | None,
        *,
        public_key: VerifyKey | None,
        announced: asyncio.Event,
        report_changed: asyncio.Event,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`report_changed` is set when the birth's upgrade report changes (a new birth
        goes out)."""
        self._context = context
        self._options = options
        self._versions = VersionsDir(options.versions_dir) if options else None
        self._public_key = public_key
        self._announced = announced
        self._report_changed = report_changed
        self._clock = clock
        self._work: asyncio.TaskGroup | None = None
        self._busy_with: str | None = None
        self._failure = self._versions.failure() if self._versions else None

    @property
    def supervised(self) -> bool:
        return self._options is not None

    def report(self) -> AgentUpgradeReport | None:
        failure = self._failure
        if failure is None or failure.outcome not in ("failed", "rolled-back"):
            return None
        return AgentUpgradeReport(
            version=failure.version[:64],
            rollout_id=failure.rollout_id[:64],
            outcome="failed" if failure.outcome == "failed" else "rolled-back",
            detail=failure.detail[:1024],
            at=max(0.0, failure.at),
        )

    # ---- module hooks ------------------------------------------------------------------

    async def start(self, work: asyncio.TaskGroup) -> None:
        self._work = work
        if self._options is not None:
            work.create_task(self._say_healthy(self._options.health_file), name="upgrade-health")

    # ---- what the desired document asks --------------------------------------------------

    def offer(self, upgrade: AgentUpgrade | None) -> None:
        """The applied document's `agent_upgrade`: start on it unless it is this version,
        one failed here already in the same rollout, or one is being fetched (the
        document that follows the restart names the latest)."""
        if upgrade is None or upgrade.version == __version__ or self._busy_with is not None:
            return
        failure = self._failure
        if failure is not None and (failure.version, failure.rollout_id) == (
            upgrade.version,
            upgrade.rollout_id,
        ):
            return
        if self._versions is None or self._work is None:
            self._context.log.info(
                "agent upgrade ignored: no supervisor runs this agent", version=upgrade.version
            )
            return
        if self._public_key is None:
            self._fail(upgrade, "no control-plane key to check the package with")
            return
        self._busy_with = upgrade.version
        self._work.create_task(self._upgrade(upgrade, self._versions), name="agent-upgrade")

    async def _upgrade(self, upgrade: AgentUpgrade, versions: VersionsDir) -> None:
        # Imported here: about 5 MB an agent that is never upgraded does not hold.
        import aiohttp

        log = self._context.log.bind(version=upgrade.version)
        package = versions.root / f"{upgrade.version}.whl.part"
        try:
            await asyncio.to_thread(versions.root.mkdir, parents=True, exist_ok=True)
            await self._download(upgrade, package)
            await asyncio.to_thread(self._install, upgrade, package, versions)
        except (PackageError, aiohttp.ClientError, TimeoutError, OSError) as error:
            log.warning("agent upgrade failed", error=str(error))
            self._fail(upgrade, str(error) or type(error).__name__)
            return
        finally:
            package.unlink(missing_ok=True)
            self._busy_with = None
        log.info("agent upgrade staged: starting the new version", previous=__version__)
        assert self._options is not None
        self._options.request_restart()

    async def _download(self, upgrade: AgentUpgrade, path: Path) -> None:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=DOWNLOAD_TIMEOUT_S)
        for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
            try:
                async with aiohttp.ClientSession(timeout=timeout) as session:
                    await self._fetch(session, upgrade, path)
                return
            except (aiohttp.ClientError, TimeoutError):
                if attempt == DOWNLOAD_ATTEMPTS:
                    raise
                await asyncio.sleep(_RETRY_PAUSE_S * attempt)

    @staticmethod
    async def _fetch(session: aiohttp.ClientSession, upgrade: AgentUpgrade, path: Path) -> None:
        async with session.get(upgrade.url) as response:
            if response.status != 200:
                raise PackageError(f"the control plane answered {response.status} for the package")
            received = 0
            with path.open("wb") as file:  # the writes below go off the loop
                async for chunk in response.content.iter_chunked(1 << 16):
                    received += len(chunk)
                    if received > upgrade.size_bytes:
                        raise PackageError(f"the package is larger than {upgrade.size_bytes} bytes")
                    await asyncio.to_thread(file.write, chunk)

    def _install(self, upgrade: AgentUpgrade, package: Path, versions: VersionsDir) -> None:
        """Check the fetched file and unpack it as the version on trial. Blocking."""
        sha256, size_bytes = file_sha256(package)
        if (sha256, size_bytes) != (upgrade.sha256, upgrade.size_bytes):
            raise PackageError("the package is not the file the control plane named (sha256)")
        assert self._public_key is not None
        facts = PackageFacts(version=upgrade.version, sha256=sha256, size_bytes=size_bytes)
        verify_package_signature(facts, upgrade.signature, self._public_key)
        declared = inspect_wheel(package)
        if declared.version != upgrade.version:
            raise PackageError(f"the package is version {declared.version}, not {upgrade.version}")
        site = versions.site(upgrade.version)
        import shutil  # with bz2 and lzma: an agent holds none until it upgrades

        shutil.rmtree(site.parent, ignore_errors=True)  # a half-unpacked earlier attempt
        unpack_wheel(package, site)
        versions.start_trial(
            Trial(
                version=upgrade.version,
                rollout_id=upgrade.rollout_id,
                previous=_running_version(versions, upgrade.version),
                health_timeout_s=upgrade.health_timeout_s,
            )
        )

    def _fail(self, upgrade: AgentUpgrade, detail: str) -> None:
        failure = Failure(
            version=upgrade.version,
            rollout_id=upgrade.rollout_id,
            outcome="failed",
            detail=detail[:1024],
            at=self._clock(),
        )
        self._failure = failure
        if self._versions is not None:
            try:
                self._versions.record_failure(failure)
            except OSError as error:
                self._context.log.warning("upgrade failure not recorded", error=str(error))
        self._report_changed.set()

    async def _say_healthy(self, health_file: Path) -> None:
        """Tell the supervisor this version announced itself (its birth is out)."""
        await self._announced.wait()

        def write() -> None:
            health_file.parent.mkdir(parents=True, exist_ok=True)
            health_file.write_text(__version__)

        try:
            await asyncio.to_thread(write)
        except OSError as error:  # the supervisor then rolls a version on trial back
            self._context.log.warning("health file not written", error=str(error))
