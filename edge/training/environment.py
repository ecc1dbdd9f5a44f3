"""The environment a training worker starts with: nothing of the agent's own.

Each process of a worker gets, in this order (later wins):

1. neutral defaults (shared.worker_env.DEFAULT_VARIABLES: PATH, LANG) and HOME,
   TMPDIR (a private one: the sandbox's /tmp, else its work directory's tmp/), USER and
   LOGNAME for its work directory and user;
2. the job's `env`, then its `secret_env` (opened from the sealed document just
   before it starts);
3. greenfed's contract (shared.worker_env.RUNNER_VARIABLES): ranks, rendezvous, the
   devices it was given, the job's identity, its cores.

A gang's workers on one node are `spec.processes` processes (launch "per-worker":
process i is rank `spec.rank + i`, with its share of the node's accelerators and
cores) or one process that starts them itself (launch "per-node", as torchrun does:
told NPROC_PER_NODE and torchrun's own PET_* options, with all of them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shared.messages import Accelerator, DesiredTraining
from shared.worker_env import DEFAULT_VARIABLES


class WorkerSpecError(ValueError):
    """A worker this node cannot run as sent (an accelerator it lacks, say)."""


def visible_devices(assigned_ids: Sequence[str], inventory: Sequence[Accelerator]) -> str:
    """CUDA_VISIBLE_DEVICES for the assigned GPUs: their UUIDs (MIG instances have no
    other name, and a UUID names the same GPU whatever a sandbox lets CUDA enumerate),
    indices for GPUs without one."""
    by_id = {accelerator.id: accelerator for accelerator in inventory}
    entries = []
    for accelerator_id in assigned_ids:
        accelerator = by_id.get(accelerator_id)
        if accelerator is None:
            raise WorkerSpecError(f"accelerator {accelerator_id!r} is not on this node")
        if accelerator.kind != "gpu":
            continue
        if accelerator.uuid:
            entries.append(accelerator.uuid)
        elif accelerator.index is not None:
            entries.append(str(accelerator.index))
    return ",".join(entries)


def unrunnable_reason(spec: DesiredTraining, inventory: Sequence[Accelerator]) -> str:
    """Why the worker(s) in `spec` cannot run on a node with `inventory` ("": they can)."""
    try:
        for local in range(process_count(spec)):
            visible_devices(process_accelerators(spec, local), inventory)
    except WorkerSpecError as error:
        return str(error)
    return ""


def process_count(spec: DesiredTraining) -> int:
    """Processes this node starts for the worker(s) in `spec`."""
    return spec.processes if spec.launch == "per-worker" else 1


def process_accelerators(spec: DesiredTraining, local: int) -> tuple[str, ...]:
    """The accelerators of process `local`: an equal share of the node's, in order
    (launched per node: all of them)."""
    ids = spec.accelerator_ids
    count = process_count(spec)
    if count == 1:
        return ids
    if len(ids) % count:
        raise WorkerSpecError(
            f"{len(ids)} accelerators cannot be shared equally by {count} workers"
        )
    share = len(ids) // count
    return ids[local * share : (local + 1) * share]


def process_cores(spec: DesiredTraining) -> float | None:
    """CPU cores each process holds (None: none held)."""
    if spec.cpu_cores is None:
        return None
    return spec.cpu_cores / process_count(spec)


def _count_text(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def process_environment(
    spec: DesiredTraining,
    inventory: Sequence[Accelerator],
    *,
    local: int,
    secret_env: Mapping[str, str],
    work_dir: str,
    user_name: str,
    tmp_dir: str = "/tmp",
) -> dict[str, str]:
    """The whole environment of process `local` of the worker(s) in `spec`."""
    per_node = spec.launch == "per-node"
    gpus = visible_devices(process_accelerators(spec, local), inventory)
    environment = {
        **DEFAULT_VARIABLES,
        "HOME": work_dir,
        "TMPDIR": tmp_dir,
        "USER": user_name,
        "LOGNAME": user_name,
        **spec.env,
        **secret_env,
    }
    environment.update(
        {
            "GREENFED_JOB_ID": spec.job_id,
            "GREENFED_ATTEMPT": str(spec.attempt),
            "GREENFED_TENANT": spec.tenant,
            "GREENFED_WORK_DIR": work_dir,
            # No GPU assigned means no GPU visible: an empty value hides them all.
            "CUDA_VISIBLE_DEVICES": gpus,
            "NVIDIA_VISIBLE_DEVICES": gpus or "void",
            "WORLD_SIZE": str(spec.world_size),
            "RANK": str(spec.rank + (0 if per_node else local)),
            "LOCAL_RANK": str(0 if per_node else local),
            "LOCAL_WORLD_SIZE": str(spec.processes),
            "NPROC_PER_NODE": str(spec.processes),
            "NODE_RANK": str(spec.node_rank),
            "GROUP_RANK": str(spec.node_rank),
            "NNODES": str(spec.nodes),
        }
    )
    rendezvous = {}
    if spec.master_addr:
        rendezvous["MASTER_ADDR"] = spec.master_addr
    if spec.master_port:
        rendezvous["MASTER_PORT"] = str(spec.master_port)
    environment.update(rendezvous)
    if per_node:
        # torchrun takes its options from these when the command line gives none.
        torchrun = {
            "NNODES": str(spec.nodes),
            "NPROC_PER_NODE": str(spec.processes),
            "NODE_RANK": str(spec.node_rank),
            **rendezvous,
        }
        environment.update({f"PET_{name}": value for name, value in torchrun.items()})
    cores = process_cores(spec)
    if cores is not None:
        # The cores the scheduler holds for it: thread pools sized to them, not to the
        # whole machine (other jobs' cores). The job's own OMP_NUM_THREADS is its choice.
        environment["GREENFED_CPU_CORES"] = _count_text(cores)
        if "OMP_NUM_THREADS" not in spec.env:
            environment["OMP_NUM_THREADS"] = str(max(1, int(cores)))
    return environment
