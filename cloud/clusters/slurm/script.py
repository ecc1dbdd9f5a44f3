"""One gang attempt as a Slurm batch job: `sbatch` options and the batch script.

A gang is one job: `--nodes` and `--nodelist` (the nodes greenfed chose), tasks per
node (one per worker; one per node for `launch = "per-node"`), `--gres=gpu:<type>:<n>`,
`--mem` (the host memory greenfed counted its workers on a node to hold), `--time` from
the job's estimate or deadline, `--chdir` (the job's working_dir; a relative one under
the registration's work_dir). Its name is `gf-<job id>-<attempt>`: a
control plane that restarts between `sbatch` and knowing its id finds it by that name
and adopts it instead of submitting it again.

The script keeps greenfed's worker environment contract (shared/worker_env.py): a small
launcher in POSIX sh, run once per task by `srun`, sets RANK, LOCAL_RANK, WORLD_SIZE,
NODE_RANK, NNODES, MASTER_ADDR (the first node), MASTER_PORT and the rest from Slurm's
own SLURM_* variables, then execs the job's command with its arguments as given (no
shell parses them). Nothing of the control plane's environment reaches the job
(`--export=NONE`); CUDA_VISIBLE_DEVICES is Slurm's (it binds the GPUs it allocated).
A job's secrets (a cluster registered with `accepts_secrets`) are exported by the
script like its `env`: the cluster keeps the script (slurmctld's state, readable by the
cluster's administrators and by the account greenfed submits with).
"""

from __future__ import annotations

import math
import posixpath
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from cloud.clusters.backend import ClusterRefused, GangRequest
from shared.worker_env import DEFAULT_VARIABLES

_MIB: Final = 1 << 20
# Each task: greenfed's variables from Slurm's, then the job's command.
_TASK_LAUNCHER: Final = (
    'per_node="$1"; shift; '
    'export LOCAL_WORLD_SIZE="$SLURM_NTASKS_PER_NODE" NPROC_PER_NODE="$SLURM_NTASKS_PER_NODE" '
    'NNODES="$SLURM_JOB_NUM_NODES" NODE_RANK="$SLURM_NODEID" GROUP_RANK="$SLURM_NODEID"; '
    'if [ "$per_node" = 1 ]; then '
    'export NPROC_PER_NODE="$GREENFED_PROCESSES" LOCAL_WORLD_SIZE="$GREENFED_PROCESSES" '
    "RANK=$((SLURM_NODEID * GREENFED_PROCESSES)) LOCAL_RANK=0 "
    "WORLD_SIZE=$((SLURM_JOB_NUM_NODES * GREENFED_PROCESSES)) "
    'PET_NNODES="$SLURM_JOB_NUM_NODES" PET_NPROC_PER_NODE="$GREENFED_PROCESSES" '
    'PET_NODE_RANK="$SLURM_NODEID" PET_MASTER_ADDR="$MASTER_ADDR" '
    'PET_MASTER_PORT="$MASTER_PORT"; '
    'else export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"; fi; '
    'exec "$@"'
)


@dataclass(frozen=True, slots=True)
class SubmitOptions:
    """How a cluster takes greenfed's jobs (its registration says)."""

    work_dir: str  # where job output files go, on the cluster's shared filesystem
    account: str = ""
    # greenfed priority (p0, p1, p2) -> a QOS, and -> a --nice value.
    qos: Mapping[str, str] = field(default_factory=dict)
    nice: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SlurmJobShape:
    """What one gang asks Slurm for, whichever way it is submitted (`sbatch` options here,
    a slurmrestd job description in cloud/clusters/slurm/rest_dialects.py)."""

    name: str
    comment: str
    partition: str
    nodes: int
    machines: tuple[str, ...]  # the machines greenfed chose, in rank order
    tasks_per_node: int
    gpu_type: str | None
    gpus_per_node: int
    cpus_per_task: int | None
    memory_per_node_mib: int | None  # None: the cluster's default
    time_limit_min: int | None
    output: str  # Slurm's file name pattern (`%j`: the job id)
    working_dir: str
    account: str
    qos: str
    nice: int | None


def comment_prefix(job_id: str, attempt: int) -> str:
    """How the comment greenfed gives an attempt's Slurm job begins (its tenant follows)."""
    return f"greenfed:{job_id}:{attempt}:"


def output_file(options: SubmitOptions, key: str, slurm_job_id: str = "%j") -> str:
    """Where a job's output goes (`--output`): with Slurm's `%j`, or the job's own id."""
    return f"{options.work_dir.rstrip('/')}/{key}-{slurm_job_id}.out"


def cluster_working_dir(working_dir: str | None, work_dir: str) -> str:
    """Where a job runs on the cluster (`--chdir`, slurmrestd's `current_working_directory`):
    its own absolute `working_dir`; a relative one under the registration's `work_dir`;
    none, `work_dir` itself. `sbatch` and slurmrestd would resolve a relative one against
    their own working directory (the control plane's, or the daemon's): nothing the job's
    author can know. Raises `ClusterRefused` for a relative one where `work_dir` is not an
    absolute path to put it under."""
    if not working_dir:
        return work_dir
    if working_dir.startswith("/"):
        return working_dir
    if not work_dir.startswith("/"):
        raise ClusterRefused(
            f"the relative working_dir {working_dir[:200]!r} has no place on the cluster: "
            f"its registration's work_dir {work_dir[:200]!r} is not an absolute path"
        )
    return posixpath.join(work_dir, working_dir)


def job_shape(gang: GangRequest, options: SubmitOptions) -> SlurmJobShape:
    members = gang.members
    tasks = {1 if gang.per_node else member.processes for member in members}
    # Equal on every node for every gang greenfed places today (docs/backends.md).
    tasks_per_node = max(tasks)
    cpus = max(member.cpus for member in members)
    host_memory_bytes = max(member.host_memory_bytes for member in members)
    return SlurmJobShape(
        name=gang.key,
        comment=comment_prefix(gang.job_id, gang.attempt) + gang.tenant,
        partition=gang.partition,
        nodes=len(members),
        machines=tuple(member.node for member in members),
        tasks_per_node=tasks_per_node,
        gpu_type=gang.accelerator_type,
        gpus_per_node=max(member.accelerators for member in members),
        cpus_per_task=max(1, cpus // tasks_per_node) if cpus else None,
        # Slurm's memory unit is the MiB: part of one is a whole one, never less than
        # greenfed counted.
        memory_per_node_mib=math.ceil(host_memory_bytes / _MIB) if host_memory_bytes else None,
        time_limit_min=(
            max(1, math.ceil(gang.time_limit_s / 60)) if gang.time_limit_s is not None else None
        ),
        output=output_file(options, gang.key),
        working_dir=cluster_working_dir(gang.working_dir, options.work_dir),
        account=options.account,
        qos=options.qos.get(gang.priority, ""),
        nice=options.nice.get(gang.priority),
    )


def sbatch_arguments(gang: GangRequest, options: SubmitOptions) -> list[str]:
    """`sbatch` and its options; the script goes on standard input."""
    shape = job_shape(gang, options)
    arguments = [
        "sbatch",
        "--parsable",
        f"--job-name={shape.name}",
        f"--comment={shape.comment}",
        f"--partition={shape.partition}",
        f"--nodes={shape.nodes}",
        f"--nodelist={','.join(shape.machines)}",
        f"--ntasks-per-node={shape.tasks_per_node}",
        f"--output={shape.output}",
        f"--chdir={shape.working_dir}",
        "--export=NONE",
        "--kill-on-invalid-dep=yes",
        "--no-requeue",
    ]
    if shape.gpu_type is not None:
        arguments.append(f"--gres=gpu:{shape.gpu_type}:{shape.gpus_per_node}")
    if shape.cpus_per_task is not None:
        arguments.append(f"--cpus-per-task={shape.cpus_per_task}")
    if shape.memory_per_node_mib is not None:
        arguments.append(f"--mem={shape.memory_per_node_mib}M")
    if shape.time_limit_min is not None:
        arguments.append(f"--time={shape.time_limit_min}")
    if shape.account:
        arguments.append(f"--account={shape.account}")
    if shape.qos:
        arguments.append(f"--qos={shape.qos}")
    if shape.nice is not None:
        arguments.append(f"--nice={shape.nice}")
    return arguments


def batch_script(gang: GangRequest) -> str:
    """The script `sbatch` runs on the first node of the allocation."""
    processes = max(member.processes for member in gang.members)
    lines = [
        "#!/bin/sh",
        f"# greenfed job {gang.job_id}, attempt {gang.attempt}, tenant {gang.tenant}",
    ]
    for name, value in DEFAULT_VARIABLES.items():
        lines.append(f'export {name}="${{{name}:-{value}}}"')
    for name, value in sorted({**gang.env, **gang.secret_env}.items()):
        lines.append(f"export {name}={shlex.quote(value)}")
    fixed = {
        "GREENFED_JOB_ID": gang.job_id,
        "GREENFED_ATTEMPT": str(gang.attempt),
        "GREENFED_TENANT": gang.tenant,
        "GREENFED_PROCESSES": str(processes),
        "MASTER_PORT": str(gang.master_port),
    }
    for name, value in fixed.items():
        lines.append(f"export {name}={shlex.quote(value)}")
    lines += [
        'GREENFED_WORK_DIR="$(pwd)"; export GREENFED_WORK_DIR',
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        "export MASTER_ADDR",
        "exec srun --kill-on-bad-exit=1 --export=ALL sh -c "
        + shlex.quote(_TASK_LAUNCHER)
        + " greenfed-task "
        + ("1" if gang.per_node else "0")
        + " "
        + " ".join(shlex.quote(part) for part in gang.command),
        "",
    ]
    return "\n".join(lines)
