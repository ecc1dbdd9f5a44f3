"""A Slurm cluster as a greenfed back-end (cloud/clusters/backend.py), through its
commands on a login node (cloud/clusters/slurm/commands.py).

- capacity: `scontrol -o show node` (GPUs by GRES type, what Slurm allocated, drained
  and down nodes), the partitions' states (`scontrol -a -o show partition`: a machine
  none of whose partitions is up takes no work) and the length of the pending queue
  (`squeue -h -t PD`);
- jobs: `scontrol -o show job` (live jobs and those that ended within the cluster's
  `MinJobAge`) and, where the cluster keeps accounting, `sacct` for older ones (while
  slurmdbd does not answer, the live ones alone, `history_error` saying why); only
  jobs named `gf-<job id>-<attempt>` with greenfed's comment, owned by the account
  greenfed runs the commands as (its uid, from `id -u` once), are greenfed's: `scontrol`
  lists every user's jobs, and any user can name and comment a job as greenfed does;
- submit: `sbatch --parsable` (cloud/clusters/slurm/script.py), after looking for a job
  of that name and greenfed's comment among the account's own first (a submission whose
  answer was lost is adopted, never repeated);
- cancel: `scancel`; output: the job's `StdOut` file, read where the commands run, and
  only where it is the file greenfed asked for (`--output`), not a link: the cluster
  reports whatever path a job's owner chose.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import stat
import time
from pathlib import Path
from typing import Final

import structlog

from cloud.clusters.backend import (
    ClusterBackend,
    ClusterCapacity,
    ClusterJob,
    ClusterRefused,
    ClusterUnreachable,
    GangRequest,
    job_key,
)
from cloud.clusters.slurm.accounting_reads import AccountingReads
from cloud.clusters.slurm.commands import SlurmCommands
from cloud.clusters.slurm.records import (
    SACCT_FIELDS,
    accounted_jobs,
    energy_of_live_jobs,
    gathers_energy,
    is_slurm_job_id,
    jobs_of,
    nodes_of,
    partition_states,
    slurm_lines,
    with_partition_states,
)
from cloud.clusters.slurm.script import (
    SubmitOptions,
    batch_script,
    job_shape,
    output_file,
    sbatch_arguments,
)

# How far back `sacct` is asked about greenfed's jobs.
ACCOUNTING_WINDOW_S: Final = 7 * 86400.0
# How often running jobs' energy is read from `sacct` (slurmd gathers it every
# JobAcctGatherFrequency, 30 s by default; each `sacct` costs slurmdbd a query).
ENERGY_INTERVAL_S: Final = 30.0
# Reads a job's output over SSH ($1 offset, $2 path, $3 limit): nothing from a link or
# anything but a regular file (`tail` would follow a link to any file the account can
# read). The test alone left a window: a link swapped in after it was followed. So the
# file is opened without following a link (`iflag=nofollow`) nor waiting on a FIFO
# (`nonblock`); a refused open reads nothing, as a missing file does.
_REMOTE_READ: Final = (
    'if [ -L "$2" ] || [ ! -f "$2" ]; then exit 0; fi; '
    'dd if="$2" iflag=nofollow,nonblock,skip_bytes,count_bytes skip="$1" count="$3" '
    "bs=65536 status=none 2>/dev/null; exit 0"
)

_log = structlog.get_logger("greenfed.clusters.slurm")


class SlurmBackend(ClusterBackend):
    def __init__(self, commands: SlurmCommands, options: SubmitOptions) -> None:
        self._commands = commands
        self._options = options
        self._accounting = AccountingReads("sacct")
        # None: not known yet whether it gathers energy (an AcctGatherEnergyType).
        self._gathers_energy: bool | None = None
        self._energy_read_at = -ENERGY_INTERVAL_S
        self._energy_j: dict[str, float] = {}  # Slurm job id -> J so far
        # Jobs whose reported output file is not the one greenfed asked for (logged once).
        self._foreign_output: set[str] = set()
        # The uid of the account the commands run as (None: not asked yet).
        self._account_uid: int | None = None

    async def account_uid(self) -> int:
        """The uid of the cluster account greenfed runs the commands as, asked once where
        they run (here or over SSH); raises `ClusterRefused` where it cannot be told (no
        job is then believed to be greenfed's: the cluster shows unreachable, saying so)."""
        if self._account_uid is None:
            answer = (await self._commands.run("id", "-u")).strip()
            if not (answer.isascii() and answer.isdigit() and len(answer) <= 10):
                raise ClusterRefused(
                    f"cannot tell greenfed's jobs from other users': `id -u` answered "
                    f"{answer[:100]!r}, not the account's uid"
                )
            self._account_uid = int(answer)
        return self._account_uid

    @property
    def history_error(self) -> str:
        """Why the last `jobs(include_ended=True)` could not read the cluster's accounting
        (slurmdbd away while slurmctld answers: only live jobs were listed); "": it could,
        or the cluster keeps none."""
        return self._accounting.history_error

    @property
    def interface(self) -> str:
        where = f"over ssh {self._commands.access.ssh}" if self._commands.access.ssh else "here"
        return f"Slurm commands, {where}"

    async def capacity(self) -> ClusterCapacity:
        nodes = nodes_of(await self._commands.run("scontrol", "-o", "show", "node"))
        # `-a`: hidden partitions too (a machine's record names them all the same).
        partitions = await self._commands.run("scontrol", "-a", "-o", "show", "partition")
        nodes = with_partition_states(nodes, partition_states(partitions))
        pending = await self._commands.run("squeue", "-h", "-t", "PD", "-o", "%i")
        return ClusterCapacity(nodes=nodes, pending_jobs=len(pending.split()))

    async def jobs(self, *, include_ended: bool = True) -> tuple[ClusterJob, ...]:
        account_uid = await self.account_uid()
        live = await self._with_energy(
            jobs_of(
                await self._commands.run("scontrol", "-o", "show", "job"), account_uid=account_uid
            )
        )
        if not include_ended:
            return live
        known = {job.backend_id for job in live}
        older = tuple(
            job for job in await self._accounted(account_uid) if job.backend_id not in known
        )
        return live + older

    async def _with_energy(self, live: tuple[ClusterJob, ...]) -> tuple[ClusterJob, ...]:
        """Running jobs with what the cluster measured they used, where it gathers energy
        (read every ENERGY_INTERVAL_S; the last reading stands between)."""
        running = [job.backend_id for job in live if job.state == "running"]
        if not running or self._accounting.kept_none:
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
            except (ClusterRefused, ClusterUnreachable) as error:  # slurmdbd's, not slurmctld's
                _log.info("job energy not read", detail=str(error)[:200])
            else:
                self._energy_j = energy_of_live_jobs(text)
        return tuple(
            dataclasses.replace(job, consumed_energy_j=self._energy_j[job.backend_id])
            if job.backend_id in self._energy_j
            else job
            for job in live
        )

    async def _accounted(self, account_uid: int) -> tuple[ClusterJob, ...]:
        """greenfed's jobs in the cluster's accounting; () where it keeps none. Asked for
        the account's own by its uid: without `--user`, an operator account (root, the
        SlurmUser) would be answered with every user's."""
        if self._accounting.kept_none:
            return ()
        since = time.strftime(
            "%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - ACCOUNTING_WINDOW_S)
        )
        try:
            text = await self._commands.run(
                "sacct", "-X", "-P", "-n", "-S", since, f"--user={account_uid}",
                "-o", ",".join(SACCT_FIELDS),
            )  # fmt: skip
        except (ClusterUnreachable, ClusterRefused) as error:  # slurmdbd's (accounting_reads)
            self._accounting.failed(error)
            return ()
        self._accounting.answered()
        return accounted_jobs(text)

    async def submit(self, gang: GangRequest) -> str:
        # A job of that name Slurm still knows (live, or ended within MinJobAge) is this
        # attempt already: adopted. (The bridge adopts what the cluster's history holds.)
        # Only the account's own (`--me`: any cluster user can name a job so) with the
        # comment greenfed gives it.
        comment = job_shape(gang, self._options).comment
        named = await self._commands.run("squeue", "-h", "--me", "--name", gang.key, "-o", "%i|%k")
        for line in slurm_lines(named):
            backend_id, _, its_comment = line.strip().partition("|")
            if is_slurm_job_id(backend_id) and its_comment == comment:
                _log.info("slurm job adopted", key=gang.key, slurm_job_id=backend_id)
                return backend_id
        output = await self._commands.run(
            *sbatch_arguments(gang, self._options), stdin=batch_script(gang).encode()
        )
        backend_id = output.strip().split(";")[0]
        if not is_slurm_job_id(backend_id):
            raise ClusterRefused(f"sbatch answered {output.strip()[:200]!r}, not a job id")
        _log.info("slurm job submitted", key=gang.key, slurm_job_id=backend_id)
        return backend_id

    async def cancel(self, job: ClusterJob) -> None:
        if not is_slurm_job_id(job.backend_id):  # never an option of scancel's
            raise ClusterRefused(f"{job.backend_id[:50]!r} is not a Slurm job id")
        await self._commands.run("scancel", "--", job.backend_id)

    async def read_output(self, job: ClusterJob, offset: int, limit: int) -> bytes:
        path = expected_output(job, self._options, self._foreign_output)
        if path is None:
            return b""
        if self._commands.access.ssh:
            # The bytes as `dd` read them: decoding here would turn a character cut at
            # `limit` (or any byte that is not UTF-8) into U+FFFD, 3 bytes long, and the
            # caller's offset would move by what it was given, not by what the file holds.
            return await self._commands.run_bytes(
                "sh", "-c", _REMOTE_READ, "sh", str(offset), path, str(limit)
            )
        return await read_local_output(path, offset, limit)


def expected_output(job: ClusterJob, options: SubmitOptions, logged: set[str]) -> str | None:
    """The job's output file where the cluster reports the one greenfed asked for
    (`--output=<work_dir>/<name>-%j.out`, cloud/clusters/slurm/script.py); None where
    it reports none, or another (logged once per job in `logged`): a job's owner
    chooses its `StdOut`, and the control plane reads it on its own host."""
    if job.output_path is None:
        return None
    name = job_key(job.job_id, job.attempt)
    expected = output_file(options, name, job.backend_id)
    if job.output_path == expected:
        return expected
    if job.backend_id not in logged:
        logged.add(job.backend_id)
        _log.warning(
            "slurm job output not read: not the file greenfed asked for",
            key=name,
            slurm_job_id=job.backend_id,
            reported=job.output_path[:500],
            expected=expected,
        )
    return None


async def read_local_output(path: str, offset: int, limit: int) -> bytes:
    """Up to `limit` bytes of a job's output file on this host from `offset` (b"": none
    yet, no more, or not a regular file: a link is not followed)."""
    return await asyncio.to_thread(_read_part, Path(path), offset, limit)


def _read_part(path: Path, offset: int, limit: int) -> bytes:
    # O_NOFOLLOW: the job (the cluster account greenfed submits with) can replace its
    # output file with a link to any file of this host; O_NONBLOCK: or with a FIFO.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags)
    except FileNotFoundError:
        return b""
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        _log.warning("slurm job output not read: a link", path=str(path)[:500])
        return b""
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            _log.warning("slurm job output not read: not a regular file", path=str(path)[:500])
            return b""
        file.seek(offset)
        return file.read(limit)
