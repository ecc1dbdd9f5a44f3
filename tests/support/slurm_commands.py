"""Slurm's commands faked by a `bin_dir` of small scripts (a registration's
`slurm.bin_dir`): each answers what the test last told it, and every call is logged, so
the real transport (cloud/clusters/slurm/commands.py: a subprocess, its exit status, its
stderr) is what is exercised. `id -u` is the real one: the jobs below are the account's.

tests/integration/test_slurm_backend.py runs a real cluster; this is for what a real one
cannot be made to do on cue (slurmdbd refusing while slurmctld answers, a job aged out).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

# One machine of partition `gpu` with four A100s, none allocated.
NODE_LINE = (
    "NodeName=gfnode1 Arch=x86_64 CPUAlloc=0 CPUTot=8 Gres=gpu:a100:4 NodeAddr=127.0.0.1 "
    "RealMemory=8000 AllocMem=0 State=IDLE Partitions=gpu AllocTRES= CapWatts=n/a"
)
# What sacct says while slurmdbd is down (slurmctld answering).
SLURMDBD_DOWN = (
    "sacct: error: slurm_persist_conn_open_without_init: failed to open persistent "
    "connection to host:localhost:6819: Connection refused\n"
    "sacct: error: Sending PersistInit msg: Connection refused\n"
    "sacct: error: Problem talking to the database: Connection refused"
)

_SCRIPT = """#!/bin/sh
here={here}
name={name}
echo "$name $*" >> "$here/calls.log"
case "$name" in
  scontrol) answer="$here/scontrol-$(eval echo \\${{$#}})" ;;
  *) answer="$here/$name" ;;
esac
[ "$name" = sbatch ] && cat > /dev/null
[ -f "$answer.out" ] && cat "$answer.out"
[ -f "$answer.err" ] && cat "$answer.err" >&2
[ -f "$answer.rc" ] && exit "$(cat "$answer.rc")"
exit 0
"""


def job_line(backend_id: str, job_id: str, attempt: int, state: str, **fields: str) -> str:
    """One `scontrol -o show job` record of greenfed's, owned by this account."""
    values = {
        "JobId": backend_id,
        "JobName": f"gf-{job_id}-{attempt}",
        "UserId": f"greenfed({os.getuid()})",
        "JobState": state,
        "Reason": "None",
        "ExitCode": "0:0",
        "SubmitTime": "1700000000",
        "StartTime": "Unknown" if state == "PENDING" else "1700000001",
        "EndTime": "Unknown",
        "NodeList": "(null)" if state == "PENDING" else "gfnode1",
        "Comment": f"greenfed:{job_id}:{attempt}:acme",
        **fields,
    }
    return " ".join(f"{key}={value}" for key, value in values.items())


class FakeSlurmBin:
    """`scontrol`, `squeue`, `sacct`, `sbatch`, `scancel` in `path`; `scontrol`'s answer
    depends on its last argument (`node`, `job`, `config`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        for name in ("scontrol", "squeue", "sacct", "sbatch", "scancel"):
            script = path / name
            script.write_text(_SCRIPT.format(here=shlex.quote(str(path)), name=name))
            script.chmod(0o755)
        self.answer("scontrol-node", NODE_LINE + "\n")

    def answer(self, command: str, out: str = "", *, err: str = "", status: int = 0) -> None:
        """What `command` (`scontrol-job` for `scontrol -o show job`) answers from now."""
        (self.path / f"{command}.out").write_text(out)
        (self.path / f"{command}.err").write_text(err)
        (self.path / f"{command}.rc").write_text(str(status))

    def calls(self, command: str) -> list[str]:
        """The argument lines `command` was run with, in order."""
        log = self.path / "calls.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [line.partition(" ")[2] for line in lines if line.split(" ", 1)[0] == command]
