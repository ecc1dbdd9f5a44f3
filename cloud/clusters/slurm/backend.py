"""A Slurm cluster as a greenfed back-end (cloud/clusters/backend.py), through its
commands on a login node (cloud/clusters/slurm/commands.py).

- capacity: `scontrol -o show node` (GPUs by GRES type, what Slurm allocated, drained
  and down nodes) and the length of the pending queue (`squeue -h -t PD`);
- jobs: `scontrol -o show job` (live jobs and those that ended within the cluster's
  `MinJobAge`) and, where the cluster keeps accounting, `sacct` for older ones; only
  jobs named `gf-<job id>-<attempt>` are greenfed's;
- submit: `sbatch --parsable` (cloud/clusters/slurm/script.py), after looking for a job
  of that name first (a submission whose answer was lost is adopted, never repeated);
- cancel: `scancel`; output: the job's `StdOut` file, read where the commands run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Final

import structlog

from cloud.clusters.backend import (
    ClusterBackend,
    ClusterCapacity,
    ClusterJob,
    ClusterRefused,
    GangRequest,
)
from cloud.clusters.slurm.commands import SlurmCommands
from cloud.clusters.slurm.records import (
    SACCT_FIELDS,
    accounted_jobs,
    energy_of_live_jobs,
    gathers_energy,
    jobs_of,
    nodes_of,
)
from cloud.clusters.slurm.script import SubmitOptions, batch_script, sbatch_arguments

# How far back `sacct` is asked about greenfed's jobs.
ACCOUNTING_WINDOW_S: Final = 7 * 86400.0
# How often running jobs' energy is read from `sacct` (slurmd gathers it every
# JobAcctGatherFrequency, 30 s by default; each `sacct` costs slurmdbd a query).
ENERGY_INTERVAL_S: Final = 30.0

_log = structlog.get_logger("greenfed.clusters.slurm")


class SlurmBackend(ClusterBackend):
    def __init__(self, commands: SlurmCommands, options: SubmitOptions) -> None:
        self._commands = commands
        self._options = options
        # None: not known yet whether the cluster keeps accounting (sacct answers).
        self._accounting: bool | None = None
        # None: not known yet whether it gathers energy (an AcctGatherEnergyType).
        self._gathers_energy: bool | None = None
        self._energy_read_at = -ENERGY_INTERVAL_S
        self._energy_j: dict[str, float] = {}  # Slurm job id -> J so far

    @property
    def interface(self) -> str:
        where = f"over ssh {self._commands.access.ssh}" if self._commands.access.ssh else "here"
        return f"Slurm commands, {where}"

    async def capacity(self) -> ClusterCapacity:
        nodes = nodes_of(await self._commands.run("scontrol", "-o", "show", "node"))
        pending = await self._commands.run("squeue", "-h", "-t", "PD", "-o", "%i")
        return ClusterCapacity(nodes=nodes, pending_jobs=len(pending.split()))

    async def jobs(self, *, include_ended: bool = True) -> tuple[ClusterJob, ...]:
        live = await self._with_energy(
            jobs_of(await self._commands.run("scontrol", "-o", "show", "job"))
        )
        if not include_ended:
            return live
        known = {job.backend_id for job in live}
        older = tuple(job for job in await self._accounted() if job.backend_id not in known)
        return live + older

    async def _with_energy(self, live: tuple[ClusterJob, ...]) -> tuple[ClusterJob, ...]:
        """Running jobs with what the cluster measured they used, where it gathers energy
        (read every ENERGY_INTERVAL_S; the last reading stands between)."""
        running = [job.backend_id for job in live if job.state == "running"]
        if not running or self._accounting is False:
            return live
        if self._gathers_energy is None:
            config = await self._commands.run("scontrol", "show", "config")
            self._gathers_energy = gathers_energy(config)
            _log.info("cluster energy gathering", gathers=self._gathers_energy)
        if not self._gathers_energy:
            return live
        now = time.monotonic()
        if now - self._energy_read_at >= ENERGY_INTERVAL_S:
            self._energy_read_at = now
            try:
                text = await self._commands.run(
                    "sacct", "-X", "-P", "-n", "-o", "JobID,ConsumedEnergyRaw",
                    "-j", ",".join(running),
                )  # fmt: skip
            except ClusterRefused as error:
                _log.info("job energy not read", detail=str(error)[:200])
            else:
                self._energy_j = energy_of_live_jobs(text)
        return tuple(
            dataclasses.replace(job, consumed_energy_j=self._energy_j[job.backend_id])
            if job.backend_id in self._energy_j
            else job
            for job in live
        )

    async def _accounted(self) -> tuple[ClusterJob, ...]:
        """greenfed's jobs in the cluster's accounting; () where it keeps none."""
        if self._accounting is False:
            return ()
        since = time.strftime(
            "%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - ACCOUNTING_WINDOW_S)
        )
        try:
            text = await self._commands.run(
                "sacct", "-X", "-P", "-n", "-S", since, "-o", ",".join(SACCT_FIELDS)
            )
        except ClusterRefused as error:  # no slurmdbd: scontrol's window is all there is
            if self._accounting is None:
                _log.info("the cluster keeps no job accounting", detail=str(error)[:200])
            self._accounting = False
            return ()
        self._accounting = True
        return accounted_jobs(text)

    async def submit(self, gang: GangRequest) -> str:
        # A job of that name Slurm still knows (live, or ended within MinJobAge) is this
        # attempt already: adopted. (The bridge adopts what the cluster's history holds.)
        named = await self._commands.run("squeue", "-h", "--name", gang.key, "-o", "%i")
        for backend_id in named.split():
            _log.info("slurm job adopted", key=gang.key, slurm_job_id=backend_id)
            return backend_id
        output = await self._commands.run(
            *sbatch_arguments(gang, self._options), stdin=batch_script(gang).encode()
        )
        backend_id = output.strip().split(";")[0]
        if not backend_id.isdigit():
            raise ClusterRefused(f"sbatch answered {output.strip()[:200]!r}, not a job id")
        _log.info("slurm job submitted", key=gang.key, slurm_job_id=backend_id)
        return backend_id

    async def cancel(self, job: ClusterJob) -> None:
        await self._commands.run("scancel", job.backend_id)

    async def read_output(self, job: ClusterJob, offset: int, limit: int) -> bytes:
        if job.output_path is None:
            return b""
        if self._commands.access.ssh:
            text = await self._commands.run(
                "sh", "-c", 'tail -c "+$1" "$2" | head -c "$3"', "sh",
                str(offset + 1), job.output_path, str(limit),
            )  # fmt: skip
            return text.encode()
        return await read_local_output(job.output_path, offset, limit)


async def read_local_output(path: str, offset: int, limit: int) -> bytes:
    """Up to `limit` bytes of a job's output file on this host from `offset` (b"": none
    yet, or no more)."""
    return await asyncio.to_thread(_read_part, Path(path), offset, limit)


def _read_part(path: Path, offset: int, limit: int) -> bytes:
    try:
        with path.open("rb") as file:
            file.seek(offset)
            return file.read(limit)
    except FileNotFoundError:
        return b""
