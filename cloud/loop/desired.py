"""A node's stored allocations -> its `desired` document.

Training: one worker per node of a gang (`node_workers`): the node's position is its
`RANK`, the number of nodes its `WORLD_SIZE`, and the first node is the rendezvous
(`MASTER_ADDR`: its `greenfed.io/address` label, else its hostname). `MASTER_PORT`
is a stable hash of (job, attempt) into a configured range, so every worker of an
attempt, and a control plane restarted in between, computes the same one. The
worker's `cpu_cores` are the CPU cores its members hold on the node.

Inference: one entry per replica, with the model (a signed download URL and the
sha256 the file must have), the accepted providers and the batching settings. A
model that is not in the registry (or is another tenant's) is sent without a URL:
the agent reports the replica failed, saying so.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

from cloud.fleet.registry import NodeRecord
from cloud.loop.allocations import node_workers
from cloud.models.signing import ModelUrlSigner
from cloud.store import AllocationRecord, ModelRecord, WorkRecord
from cloud.work.convert import spec_of
from cloud.work.specs import DeploymentSpec, TrainingJobSpec
from shared.messages import DesiredDeployment, DesiredState, DesiredTraining
from shared.settings import SchedulingSettings

ADDRESS_LABEL = "greenfed.io/address"


def node_address(record: NodeRecord | None) -> str:
    if record is None:
        return ""
    status = record.status
    return status.labels.get(ADDRESS_LABEL) or status.host.hostname


def master_port(work_id: str, attempt: int, settings: SchedulingSettings) -> int:
    digest = zlib.crc32(f"{work_id}:{attempt}".encode())
    return settings.master_port_base + digest % settings.master_port_span


def _training(
    record: WorkRecord,
    spec: TrainingJobSpec,
    node_id: str,
    members: Sequence[AllocationRecord],
    nodes: Mapping[str, NodeRecord],
    settings: SchedulingSettings,
) -> DesiredTraining:
    workers = node_workers(members)
    ranks = list(workers)
    master = ranks[0]
    return DesiredTraining(
        job_id=record.work_id,
        attempt=record.attempts,
        command=spec.command,
        env=dict(spec.env),
        working_dir=spec.working_dir,
        accelerator_ids=tuple(
            device for member in workers[node_id] for device in member.accelerator_ids
        ),
        rank=ranks.index(node_id),
        world_size=len(ranks),
        master_addr=node_address(nodes.get(master)),
        master_port=master_port(record.work_id, record.attempts, settings),
        grace_period_s=spec.grace_period_s,
        reference_duration_s=spec.estimated_duration_s,
        # A gang is capped whole (power_capping.py): every member on a node has one limit.
        power_limit_w=min(
            (m.power_limit_w for m in workers[node_id] if m.power_limit_w is not None),
            default=None,
        ),
        cpu_cores=_cores(workers[node_id]),
    )


def _cores(members: Sequence[AllocationRecord]) -> int | None:
    """The CPU cores a node's worker may use: held beside GPU/NPU devices, or a CPU job's
    accelerators; None where the scheduler holds none."""
    cores = sum(m.accelerators if m.accelerator_kind == "cpu" else m.cpu_cores for m in members)
    return cores or None


def canary_members(spec: DeploymentSpec, members: Sequence[AllocationRecord]) -> frozenset[int]:
    """The replicas that serve a rollout's new model: the lowest replica numbers, at
    least one replica always keeping the deployment's model."""
    if spec.canary is None or len(members) < 2:
        return frozenset()
    count = min(spec.canary.replicas, len(members) - 1)
    return frozenset(sorted(m.member_index for m in members)[:count])


def _replica(
    record: WorkRecord,
    spec: DeploymentSpec,
    member: AllocationRecord,
    models: Mapping[str, ModelRecord],
    signer: ModelUrlSigner | None,
    canary: bool = False,
) -> DesiredDeployment:
    model_id = spec.canary.model_id if canary and spec.canary is not None else spec.model_id
    model = models.get(model_id)
    if model is not None and model.tenant_id != record.tenant_id:
        model = None  # another tenant's model is not there for this one
    batching = spec.batching
    return DesiredDeployment(
        deployment_id=record.work_id,
        replica=member.member_index,
        model_id=model_id,
        model_url=signer.url(model.model_id, model.sha256) if model and signer else None,
        model_sha256=model.sha256 if model else None,
        model_size_bytes=model.size_bytes if model else None,
        accelerator_kind=member.accelerator_kind,
        accelerators=member.accelerators,
        accelerator_ids=member.accelerator_ids,
        providers=spec.providers,
        max_batch_size=batching.max_batch_size if batching else 1,
        max_queue_delay_ms=batching.max_queue_delay_ms if batching else 0.0,
    )


def desired_document(
    node_id: str,
    generation: int,
    *,
    now: float,
    records: Mapping[str, WorkRecord],
    allocations: Mapping[str, tuple[AllocationRecord, ...]],
    nodes: Mapping[str, NodeRecord],
    settings: SchedulingSettings,
    models: Mapping[str, ModelRecord] | None = None,
    signer: ModelUrlSigner | None = None,
    cluster_id: str | None = None,
) -> DesiredState:
    """Everything stored for `node_id`; `allocations` maps every work id to all of its
    allocations (a gang's other nodes decide this node's rank); `models` the registry's
    records of the deployments' models, `signer` makes their download URLs; `cluster_id`
    the store's (generations count within it: an agent adopts a new one's sequence)."""
    training: list[DesiredTraining] = []
    deployments: list[DesiredDeployment] = []
    for work_id, members in sorted(allocations.items()):
        here = [member for member in members if member.node_id == node_id]
        record = records.get(work_id)
        if not here or record is None:
            continue
        spec = spec_of(record)
        if isinstance(spec, TrainingJobSpec):
            training.append(_training(record, spec, node_id, members, nodes, settings))
            continue
        assert isinstance(spec, DeploymentSpec)
        canary = canary_members(spec, members)
        deployments.extend(
            _replica(record, spec, member, models or {}, signer, member.member_index in canary)
            for member in here
        )
    return DesiredState(
        node_id=node_id,
        generation=generation,
        deployments=tuple(deployments),
        training=tuple(training),
        issued_at=now,
        cluster_id=cluster_id,
    )
