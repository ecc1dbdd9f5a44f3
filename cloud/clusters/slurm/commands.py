"""Reaching a Slurm cluster through its commands on a login node: `scontrol`, `squeue`,
`sacct`, `sbatch`, `scancel`, run here (this host is a login node: `slurm_conf` names
the cluster's slurm.conf) or over SSH (`ssh` names the login node; the control plane's
user needs a key there).

Only the commands' stable text interfaces are read: `scontrol -o` (one record a line,
key=value), `squeue`/`sacct` with explicit formats and `|` between fields, times as
Unix seconds (`SLURM_TIME_FORMAT=%s`). Their JSON output changed shape with every
release (22.05's `--json` is v0.0.38's data parser, 23.02 another, 24.05 another);
these did not.
"""

from __future__ import annotations

import asyncio
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from cloud.clusters.backend import ClusterRefused, ClusterUnreachable

SLURM_COMMANDS: Final = frozenset({"scontrol", "squeue", "sacct", "sbatch", "scancel", "sinfo"})
# A command that takes longer than this is a controller that does not answer.
DEFAULT_COMMAND_TIMEOUT_S: Final = 20.0
# What a command may print (a cluster of 10,000 nodes prints a few MB).
MAX_OUTPUT_BYTES: Final = 64 * 1024 * 1024
# How the commands (their slurm_load_* errors) and slurmrestd say the controller is
# away, not a refusal.
UNREACHABLE_MARKERS: Final = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "Zero Bytes were transmitted",
    "Unable to connect to slurmctld",
    "slurm_load_",
    "Communication connection failure",
    "Slurmctld: Unable to contact",
)


@dataclass(frozen=True, slots=True)
class SlurmAccess:
    """How to run the commands. `ssh`: `[user@]host` of a login node (empty: here);
    `slurm_conf`: the cluster's slurm.conf where the commands run (empty: their
    default); `bin_dir`: where the commands are (empty: on the PATH)."""

    ssh: str = ""
    slurm_conf: str = ""
    bin_dir: str = ""
    timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    extra_env: Mapping[str, str] = field(default_factory=dict)


class SlurmCommands:
    def __init__(self, access: SlurmAccess) -> None:
        self.access = access

    def _env(self) -> dict[str, str]:
        env = {"SLURM_TIME_FORMAT": "%s", **self.access.extra_env}
        if self.access.slurm_conf:
            env["SLURM_CONF"] = self.access.slurm_conf
        return env

    def _argv(self, argv: Sequence[str]) -> list[str]:
        program = argv[0]
        if self.access.bin_dir and program in SLURM_COMMANDS:
            program = f"{self.access.bin_dir.rstrip('/')}/{program}"
        if not self.access.ssh:
            return [program, *argv[1:]]
        # Over SSH the environment goes on the remote command line.
        assignments = [f"{key}={shlex.quote(value)}" for key, value in self._env().items()]
        remote = " ".join(["env", *assignments, shlex.quote(program), *map(shlex.quote, argv[1:])])
        return [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
            "--",
            self.access.ssh,
            remote,
        ]

    async def run(self, *argv: str, stdin: bytes | None = None) -> str:
        """The command's standard output as text (a byte that is not UTF-8 replaced);
        raises as `run_bytes` does."""
        return (await self.run_bytes(*argv, stdin=stdin)).decode(errors="replace")

    async def run_bytes(self, *argv: str, stdin: bytes | None = None) -> bytes:
        """The command's standard output as it printed it (a job's output file: offsets
        count its bytes, and a UTF-8 character cut by a read must stay cut); raises
        `ClusterUnreachable` when the command cannot be run or the controller does not
        answer, `ClusterRefused` when it says no."""
        conf = self.access.slurm_conf
        if conf and not self.access.ssh and not await asyncio.to_thread(os.path.isfile, conf):
            # The commands would retry reading it for a minute before saying so.
            raise ClusterUnreachable(f"the cluster's slurm.conf {conf} is not a file on this host")
        command = self._argv(argv)
        env = None if self.access.ssh else {**os.environ, **self._env()}
        try:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                limit=MAX_OUTPUT_BYTES,
            )
        except OSError as error:
            raise ClusterUnreachable(f"cannot run {command[0]}: {error.strerror}") from None
        except ValueError as error:
            # An argument no command line can hold (a NUL byte in a job's working_dir):
            # this order is refused, not the cluster away, nor every other order stuck.
            raise ClusterRefused(f"cannot run {argv[0]}: {error}") from None
        try:
            async with asyncio.timeout(self.access.timeout_s):
                out, err = await process.communicate(stdin)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise ClusterUnreachable(
                f"{argv[0]} did not finish within {self.access.timeout_s:g} s"
            ) from None
        message = err.decode(errors="replace").strip()
        if process.returncode == 0:
            return out
        if process.returncode == 255 and self.access.ssh:  # ssh's own failure
            raise ClusterUnreachable(f"ssh {self.access.ssh}: {message[:500]}")
        if any(marker in message for marker in UNREACHABLE_MARKERS):
            raise ClusterUnreachable(f"{argv[0]}: {message[:500]}")
        raise ClusterRefused(f"{argv[0]} exited {process.returncode}: {message[:500]}")
