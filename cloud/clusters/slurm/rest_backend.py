"""A Slurm cluster as a greenfed back-end (cloud/clusters/backend.py) through
`slurmrestd` (cloud/clusters/slurm/rest_client.py), in the best OpenAPI version both
speak (cloud/clusters/slurm/rest_dialects.py), chosen at the first contact:

- capacity: `GET /slurm/<v>/nodes`, the partitions' states (`GET /slurm/<v>/partitions`:
  a machine none of whose partitions is up takes no work) and the pending jobs of
  `GET /slurm/<v>/jobs`;
- jobs: that same listing (live jobs and those that ended within `MinJobAge`) and, where
  slurmrestd serves the accounting plugin, `GET /slurmdb/<v>/jobs` for older ones (while
  that fails, the live ones alone, `history_error` saying why); only
  those of the account greenfed asks as (`AccountIdentity`: both list every user's
  jobs, and any user can name and comment a job as greenfed does);
- submit: `POST /slurm/<v>/job/submit` with the job description of the commands
  transport's `sbatch` (cloud/clusters/slurm/script.py), after looking for a job of that
  name in the listing (adopted, never submitted twice);
- cancel: `DELETE /slurm/<v>/job/<id>`; output: the job's `standard_output` file, read
  on this host (a login node, or one mounting the cluster's shared filesystem), where it
  is the file greenfed asked for, not a link (as the commands transport).

An answer without the list its API documents (`{}`, `{"jobs": null}`: a proxy's page, a
broken slurmrestd) is the cluster not answering usably (`UnreadableAnswer`), never "no
jobs" or "no machines": a job missing from such a listing would be taken for one that
vanished. A job Slurm requeued although greenfed asked it not to (v0.0.38 ignores
`"requeue": false`) is read `stopped` and cancelled here, as `--no-requeue` would have
ended it: the loop decides what follows, and nothing runs twice.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import pwd
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import structlog

from cloud.clusters.backend import (
    ClusterBackend,
    ClusterCapacity,
    ClusterJob,
    ClusterRefused,
    ClusterUnreachable,
    GangRequest,
)
from cloud.clusters.slurm.accounting_reads import AccountingReads
from cloud.clusters.slurm.backend import (
    ACCOUNTING_WINDOW_S,
    expected_output,
    read_local_output,
)
from cloud.clusters.slurm.records import is_slurm_job_id, readable, with_partition_states
from cloud.clusters.slurm.rest_client import SlurmRestAccess, SlurmRestClient
from cloud.clusters.slurm.rest_dialects import (
    SPOKEN_VERSIONS,
    RestDialect,
    best_version,
    dialect_of,
)
from cloud.clusters.slurm.script import SubmitOptions, batch_script, job_shape

# A listing taken for `capacity` serves the `jobs` that follows it within this long.
_LISTING_REUSE_S: Final = 2.0

_log = structlog.get_logger("greenfed.clusters.slurm")


class UnreadableAnswer(ClusterUnreachable):
    """slurmrestd answered without the list its API documents: as good as no answer
    (the bridge keeps the last known states and taints the cluster's machines)."""


def _listed(answer: Mapping[str, Any], key: str, path: str) -> list[Any]:
    """The answer's `key` list (empty is an answer: none there); raises
    `UnreadableAnswer` where it has none."""
    listed = answer.get(key)
    if not isinstance(listed, list):
        raise UnreadableAnswer(
            f"slurmrestd answered {path} without its {key!r} list: {str(answer)[:200]}"
        )
    return listed


@dataclass(frozen=True, slots=True)
class AccountIdentity:
    """The cluster account slurmrestd acts as for greenfed: its uid where known (the
    socket's peer, `rest_auth/local`), its name where known (`X-SLURM-USER-NAME`, the
    token's `sun`, or the local account's)."""

    uid: int | None
    name: str

    def owns_live(self, raw: Mapping[str, Any]) -> bool:
        """Whether a job of the live listing (`user_id`, `user_name`) is the account's."""
        user_id = raw.get("user_id")
        if self.uid is not None and isinstance(user_id, int) and not isinstance(user_id, bool):
            return user_id == self.uid
        return bool(self.name) and raw.get("user_name") == self.name

    def owns_accounted(self, raw: Mapping[str, Any]) -> bool:
        """Whether a job of the accounting (`user`, a name) is the account's."""
        return bool(self.name) and raw.get("user") == self.name


def account_identity(access: SlurmRestAccess) -> AccountIdentity | None:
    """Who slurmrestd takes greenfed for; None where it cannot be told (a URL other than
    a UNIX socket, and neither a user name nor a token naming one)."""
    if access.token:
        name = access.user_name or _token_user(access.token)
        return AccountIdentity(uid=None, name=name) if name else None
    if access.url.startswith("unix:"):
        # rest_auth/local: slurmrestd acts as the socket's peer, this process.
        uid = os.getuid()
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:  # no passwd entry (a container): the live listing's uid still
            name = ""
        return AccountIdentity(uid=uid, name=name)
    if access.user_name:
        return AccountIdentity(uid=None, name=access.user_name)
    return None


def _token_user(token: str) -> str:
    """The user a Slurm JWT names (its `sun` claim), read, not verified (slurmctld
    verifies it); "" where it names none."""
    parts = token.split(".")
    if len(parts) != 3:
        return ""
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error, RecursionError):  # RecursionError: nested too deeply
        return ""
    user = payload.get("sun") if isinstance(payload, dict) else None
    return user if isinstance(user, str) else ""


class SlurmRestBackend(ClusterBackend):
    def __init__(
        self, client: SlurmRestClient, options: SubmitOptions, *, version: str | None = None
    ) -> None:
        """`version`: the OpenAPI version to speak (None: the best both offer)."""
        self._client = client
        self._options = options
        self._dialect: RestDialect | None = dialect_of(version) if version else None
        self._accounting = AccountingReads("slurmrestd")
        self._listing: tuple[float, list[Any]] | None = None
        # Jobs whose reported output file is not the one greenfed asked for (logged once).
        self._foreign_output: set[str] = set()
        self._account = account_identity(client.access)
        # Whether the partitions' listing was refused last time (logged once until read).
        self._partitions_refused = False
        # Requeued jobs whose cancel failed (logged once; asked again at each listing).
        self._requeued_not_cancelled: set[str] = set()

    def account(self) -> AccountIdentity:
        """Whose jobs are greenfed's; raises `ClusterRefused` where that cannot be told
        (no job is then believed to be greenfed's: the cluster shows unreachable)."""
        if self._account is None:
            raise ClusterRefused(
                f"cannot tell greenfed's jobs from other users' at {self._client.access.url}: "
                "register the cluster with its slurmrestd user (rest_user) or a token naming one"
            )
        return self._account

    async def dialect(self) -> RestDialect:
        """The version spoken, asked of slurmrestd at the first contact."""
        if self._dialect is None:
            offered = await self._client.offered_versions()
            version = best_version(offered)
            if version is None:
                raise ClusterRefused(
                    f"slurmrestd at {self._client.access.url} offers "
                    f"{', '.join(offered) or 'no job API'}; greenfed speaks "
                    f"{', '.join(SPOKEN_VERSIONS)} (register the cluster with its commands "
                    "instead: slurm.slurm_conf or slurm.ssh)"
                )
            self._dialect = dialect_of(version)
            _log.info(
                "slurmrestd version chosen",
                url=self._client.access.url,
                version=version,
                offered=offered,
                pins_machines=self._dialect.pins_machines,
            )
        return self._dialect

    @property
    def history_error(self) -> str:
        """Why the last `jobs(include_ended=True)` could not read the accounting (slurmdbd
        away while slurmctld answers: only live jobs were listed); "": it could, or
        slurmrestd serves none."""
        return self._accounting.history_error

    @property
    def interface(self) -> str:
        return "" if self._dialect is None else f"slurmrestd {self._dialect.version}"

    @property
    def pins_machines(self) -> bool | None:
        return None if self._dialect is None else self._dialect.pins_machines

    async def _job_listing(self, *, reuse: bool) -> list[Any]:
        dialect = await self.dialect()
        if reuse and self._listing is not None:
            taken_at, jobs = self._listing
            self._listing = None
            if time.monotonic() - taken_at < _LISTING_REUSE_S:
                return jobs
        answer = await self._client.request("GET", dialect.jobs_path)
        return _listed(answer, "jobs", dialect.jobs_path)

    async def capacity(self) -> ClusterCapacity:
        dialect = await self.dialect()
        answer = await self._client.request("GET", dialect.nodes_path)
        raw_nodes = _listed(answer, "nodes", dialect.nodes_path)
        found = (readable(dialect.node, raw, "node") for raw in raw_nodes if isinstance(raw, dict))
        nodes = tuple(node for node in found if node is not None)
        nodes = with_partition_states(nodes, await self._partition_states(dialect))
        listing = await self._job_listing(reuse=False)
        self._listing = (time.monotonic(), listing)
        pending = sum(
            1
            for raw in listing
            if isinstance(raw, dict)
            and dialect.state_text(raw.get("job_state")).startswith("PENDING")
        )
        return ClusterCapacity(nodes=nodes, pending_jobs=pending)

    async def _partition_states(self, dialect: RestDialect) -> dict[str, str]:
        """Each partition's state; {} (every partition taken to be up, as before greenfed
        read them) where slurmrestd refuses the listing (a proxy that lets only some
        paths through): the machines' own states still say which take no work."""
        try:
            answer = await self._client.request("GET", dialect.partitions_path)
        except ClusterRefused as error:
            if not self._partitions_refused:
                _log.warning("slurm partition states not read", error=str(error)[:300])
            self._partitions_refused = True
            return {}
        self._partitions_refused = False
        raw_partitions = answer.get("partitions")
        if not isinstance(raw_partitions, list):
            return {}
        found = (
            readable(dialect.partition_state, raw, "partition")
            for raw in raw_partitions
            if isinstance(raw, dict)
        )
        return dict(state for state in found if state is not None)

    async def jobs(self, *, include_ended: bool = True) -> tuple[ClusterJob, ...]:
        dialect = await self.dialect()
        account = self.account()
        listing = await self._job_listing(reuse=True)
        owned = [raw for raw in listing if isinstance(raw, dict) and account.owns_live(raw)]
        read = [(raw, readable(dialect.job, raw, "job")) for raw in owned]
        live = tuple(job for _, job in read if job is not None)
        for raw, job in read:
            if job is not None and readable(dialect.held_after_requeue, raw, "job"):
                await self._cancel_requeued(job)
        if not include_ended:
            return live
        known = {job.backend_id for job in live}
        older = tuple(
            job for job in await self._accounted(dialect, account) if job.backend_id not in known
        )
        return live + older

    async def _cancel_requeued(self, job: ClusterJob) -> None:
        """Cancel a job Slurm requeued and still holds (read `stopped`): left there, it
        would start again from its beginning beside the attempt the loop places next.
        A failed cancel is asked again at the next listing (the job is still held)."""
        try:
            await self.cancel(job)
        except (ClusterUnreachable, ClusterRefused) as error:
            if job.backend_id not in self._requeued_not_cancelled:
                _log.warning(
                    "slurm job requeued by the cluster not cancelled",
                    slurm_job_id=job.backend_id,
                    error=str(error)[:300],
                )
            self._requeued_not_cancelled.add(job.backend_id)
            return
        self._requeued_not_cancelled.discard(job.backend_id)
        _log.warning(
            "slurm job requeued by the cluster: cancelled",
            job_id=job.job_id,
            attempt=job.attempt,
            slurm_job_id=job.backend_id,
        )

    async def _accounted(
        self, dialect: RestDialect, account: AccountIdentity
    ) -> tuple[ClusterJob, ...]:
        """greenfed's jobs in the cluster's accounting; () where slurmrestd serves none."""
        if self._accounting.kept_none:
            return ()
        since = dialect.accounting_since(ACCOUNTING_WINDOW_S, time.time())
        try:
            answer = await self._client.request(
                "GET", dialect.accounting_path, params={"start_time": since}
            )
            # An answer without its list is unreachable (taken as not read this time),
            # never "no accounting kept" nor "no jobs there".
            raw_jobs = _listed(answer, "jobs", dialect.accounting_path)
        except (ClusterUnreachable, ClusterRefused) as error:  # slurmdbd's (accounting_reads)
            self._accounting.failed(error)
            return ()
        self._accounting.answered()
        found = (
            readable(dialect.accounted_job, raw, "accounted job")
            for raw in raw_jobs
            if isinstance(raw, dict) and account.owns_accounted(raw)
        )
        return tuple(job for job in found if job is not None)

    async def submit(self, gang: GangRequest) -> str:
        dialect = await self.dialect()
        account = self.account()
        # A job of that name Slurm still knows is this attempt already: adopted, where
        # it reads as greenfed's (the account's own, a number as its id, greenfed's
        # comment or none).
        for raw in await self._job_listing(reuse=False):
            if not isinstance(raw, dict) or raw.get("name") != gang.key:
                continue
            if not account.owns_live(raw):
                continue
            found = dialect.job(raw)
            if found is not None and (found.job_id, found.attempt) == (gang.job_id, gang.attempt):
                _log.info("slurm job adopted", key=gang.key, slurm_job_id=found.backend_id)
                return found.backend_id
        body = dialect.submit_body(job_shape(gang, self._options), batch_script(gang))
        answer = await self._client.request("POST", dialect.submit_path, body=body)
        backend_id = answer.get("job_id")
        if not isinstance(backend_id, int) or isinstance(backend_id, bool):
            raise ClusterRefused(f"slurmrestd answered no job id: {str(answer)[:200]}")
        _log.info("slurm job submitted", key=gang.key, slurm_job_id=backend_id)
        return str(backend_id)

    async def cancel(self, job: ClusterJob) -> None:
        if not is_slurm_job_id(job.backend_id):  # goes into the request's path
            raise ClusterRefused(f"{job.backend_id[:50]!r} is not a Slurm job id")
        dialect = await self.dialect()
        await self._client.request("DELETE", dialect.job_path(job.backend_id), gone_is_fine=True)

    async def read_output(self, job: ClusterJob, offset: int, limit: int) -> bytes:
        path = expected_output(job, self._options, self._foreign_output)
        if path is None:
            return b""
        return await read_local_output(path, offset, limit)

    async def close(self) -> None:
        await self._client.close()
