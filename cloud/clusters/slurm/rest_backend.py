"""A Slurm cluster as a greenfed back-end (cloud/clusters/backend.py) through
`slurmrestd` (cloud/clusters/slurm/rest_client.py), in the best OpenAPI version both
speak (cloud/clusters/slurm/rest_dialects.py), chosen at the first contact:

- capacity: `GET /slurm/<v>/nodes` and the pending jobs of `GET /slurm/<v>/jobs`;
- jobs: that same listing (live jobs and those that ended within `MinJobAge`) and, where
  slurmrestd serves the accounting plugin, `GET /slurmdb/<v>/jobs` for older ones;
- submit: `POST /slurm/<v>/job/submit` with the job description of the commands
  transport's `sbatch` (cloud/clusters/slurm/script.py), after looking for a job of that
  name in the listing (adopted, never submitted twice);
- cancel: `DELETE /slurm/<v>/job/<id>`; output: the job's `standard_output` file, read
  on this host (a login node, or one mounting the cluster's shared filesystem), where it
  is the file greenfed asked for, not a link (as the commands transport).
"""

from __future__ import annotations

import time
from typing import Any, Final

import structlog

from cloud.clusters.backend import (
    ClusterBackend,
    ClusterCapacity,
    ClusterJob,
    ClusterRefused,
    GangRequest,
)
from cloud.clusters.slurm.backend import (
    ACCOUNTING_WINDOW_S,
    expected_output,
    read_local_output,
)
from cloud.clusters.slurm.records import is_slurm_job_id
from cloud.clusters.slurm.rest_client import SlurmRestClient
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


class SlurmRestBackend(ClusterBackend):
    def __init__(
        self, client: SlurmRestClient, options: SubmitOptions, *, version: str | None = None
    ) -> None:
        """`version`: the OpenAPI version to speak (None: the best both offer)."""
        self._client = client
        self._options = options
        self._dialect: RestDialect | None = dialect_of(version) if version else None
        self._accounting: bool | None = None
        self._listing: tuple[float, list[Any]] | None = None
        # Jobs whose reported output file is not the one greenfed asked for (logged once).
        self._foreign_output: set[str] = set()

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
        listed = answer.get("jobs")
        return listed if isinstance(listed, list) else []

    async def capacity(self) -> ClusterCapacity:
        dialect = await self.dialect()
        answer = await self._client.request("GET", dialect.nodes_path)
        raw_nodes = answer.get("nodes")
        nodes = tuple(
            node
            for node in (dialect.node(raw) for raw in raw_nodes if isinstance(raw, dict))
            if node is not None
        ) if isinstance(raw_nodes, list) else ()  # fmt: skip
        listing = await self._job_listing(reuse=False)
        self._listing = (time.monotonic(), listing)
        pending = sum(
            1
            for raw in listing
            if isinstance(raw, dict)
            and dialect.state_text(raw.get("job_state")).startswith("PENDING")
        )
        return ClusterCapacity(nodes=nodes, pending_jobs=pending)

    async def jobs(self, *, include_ended: bool = True) -> tuple[ClusterJob, ...]:
        dialect = await self.dialect()
        listing = await self._job_listing(reuse=True)
        live = tuple(
            job
            for job in (dialect.job(raw) for raw in listing if isinstance(raw, dict))
            if job is not None
        )
        if not include_ended:
            return live
        known = {job.backend_id for job in live}
        older = tuple(job for job in await self._accounted(dialect) if job.backend_id not in known)
        return live + older

    async def _accounted(self, dialect: RestDialect) -> tuple[ClusterJob, ...]:
        """greenfed's jobs in the cluster's accounting; () where slurmrestd serves none."""
        if self._accounting is False:
            return ()
        since = dialect.accounting_since(ACCOUNTING_WINDOW_S, time.time())
        try:
            answer = await self._client.request(
                "GET", dialect.accounting_path, params={"start_time": since}
            )
        except ClusterRefused as error:  # no accounting plugin, no slurmdbd
            if self._accounting is None:
                _log.info("slurmrestd serves no job accounting", detail=str(error)[:200])
            self._accounting = False
            return ()
        self._accounting = True
        raw_jobs = answer.get("jobs")
        if not isinstance(raw_jobs, list):
            return ()
        found = (dialect.accounted_job(raw) for raw in raw_jobs if isinstance(raw, dict))
        return tuple(job for job in found if job is not None)

    async def submit(self, gang: GangRequest) -> str:
        dialect = await self.dialect()
        # A job of that name Slurm still knows is this attempt already: adopted, where
        # it reads as greenfed's (a number as its id, greenfed's comment or none).
        for raw in await self._job_listing(reuse=False):
            if not isinstance(raw, dict) or raw.get("name") != gang.key:
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
