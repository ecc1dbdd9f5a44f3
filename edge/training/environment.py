"""The environment a training worker starts with: what torchrun-style code expects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shared.messages import Accelerator, DesiredTraining


class UnknownAccelerator(ValueError):
    pass


def visible_devices(assigned_ids: Sequence[str], inventory: Sequence[Accelerator]) -> str:
    """CUDA_VISIBLE_DEVICES for the assigned GPUs: indices, or UUIDs for MIG instances
    (CUDA addresses a MIG instance only by its UUID)."""
    by_id = {accelerator.id: accelerator for accelerator in inventory}
    entries = []
    for accelerator_id in assigned_ids:
        accelerator = by_id.get(accelerator_id)
        if accelerator is None:
            raise UnknownAccelerator(f"accelerator {accelerator_id!r} is not on this node")
        if accelerator.kind != "gpu":
            continue
        if accelerator.parent_id is not None and accelerator.uuid:
            entries.append(accelerator.uuid)
        elif accelerator.index is not None:
            entries.append(str(accelerator.index))
        elif accelerator.uuid:
            entries.append(accelerator.uuid)
    return ",".join(entries)


def worker_environment(
    spec: DesiredTraining, inventory: Sequence[Accelerator], base: Mapping[str, str]
) -> dict[str, str]:
    """`base` (the agent's own environment) + the job's variables + greenfed's, which win
    (but ``OMP_NUM_THREADS`` from the job's variables is kept over its cores)."""
    environment = {**base, **spec.env}
    environment.update(
        {
            "GREENFED_JOB_ID": spec.job_id,
            "GREENFED_ATTEMPT": str(spec.attempt),
            # No GPU assigned means no GPU visible: an empty value hides them all.
            "CUDA_VISIBLE_DEVICES": visible_devices(spec.accelerator_ids, inventory),
            "WORLD_SIZE": str(spec.world_size),
            "RANK": str(spec.rank),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
        }
    )
    if spec.master_addr:
        environment["MASTER_ADDR"] = spec.master_addr
    if spec.master_port:
        environment["MASTER_PORT"] = str(spec.master_port)
    if spec.cpu_cores is not None:
        # The cores the scheduler holds for it: thread pools sized to them, not to the
        # whole machine (other jobs' cores). The job's own OMP_NUM_THREADS is its choice.
        cores = str(spec.cpu_cores)
        environment["GREENFED_CPU_CORES"] = cores
        if "OMP_NUM_THREADS" not in spec.env:
            environment["OMP_NUM_THREADS"] = cores
    return environment
