"""A node's stored allocations -> its `desired` document.

Training: one entry per node of a gang, for the gang's members on it (`node_workers`:
nodes in the order of their lowest member, members in member order). Every member is a
worker with a rank of its own: the node's entry starts at the global rank of its first
member (`rank`), runs `processes` of them, and `world_size` counts the members on all
nodes; `node_rank` and `nodes` place the node among the gang's nodes (torchrun's
NODE_RANK, NNODES). The first node is the rendezvous (`MASTER_ADDR`: its
`greenfed.io/address` label, else its hostname). `MASTER_PORT` is a stable hash of
(job, attempt) into a configured range, so every worker of an attempt, and a control
plane restarted in between, computes the same one. The entry's devices are its members'
in member order (the agent splits them evenly among its processes) and its `cpu_cores`
the cores they hold on the node. Limits, image and the least isolation come from the
spec (the cluster's `scheduling.min_isolation` when stronger). Secrets go by name
(`secret_names`) and, sealed to this node's own key for this job and attempt, in
`sealed_secrets` (cloud/secrets/release.py): never in plaintext, never another node's.

Inference: one entry per replica, with the model (a signed download URL and the
sha256 the file must have), the accepted providers and the batching settings. A
model that is not in the registry (or is another tenant's) is sent without a URL:
the agent reports the replica failed, saying so.

The agent instance a document is issued for (`for_instance`) is not decided here: the
publisher sets it as it signs, from the registry at that moment (cloud/loop/publisher.py).

**A document fits the broker's packets** (`DESIRED_MAX_BYTES`): one that did not would
never reach its node, and the publisher refuses to send it. Where a node's work adds up
to more, the jobs the node does not report yet give way, the newest submission first:
their secrets are withheld (the worker refuses to start, saying why, and the attempt
fails with that reason), and where that is not enough they are left out (an assignment
the node never acknowledges: requeued, cloud/loop/unacknowledged.py). Both are logged,
naming the jobs. A job the node reports is kept as it is: its worker may be running.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec
import structlog

from cloud.fleet.registry import NodeRecord
from cloud.loop.allocations import node_workers
from cloud.models.signing import ModelUrlSigner
from cloud.scheduler.model import stronger_isolation
from cloud.secrets.release import SecretRelease
from cloud.store import AllocationRecord, ModelRecord, WorkRecord
from cloud.work.convert import spec_of
from cloud.work.specs import DeploymentSpec, TrainingJobSpec
from shared.images import qualified
from shared.messages import (
    AgentUpgrade,
    DesiredDeployment,
    DesiredState,
    DesiredTraining,
    encode,
)
from shared.settings import SchedulingSettings

ADDRESS_LABEL = "greenfed.io/address"

# The largest signed `desired` payload that goes out. greenfed's brokers take packets of
# at most 1 MiB (max_packet_size 1048576 in deploy/mosquitto/ and deploy/compose/), and
# a packet holds the topic and its header too; over that, the broker drops the
# publisher's connection.
DESIRED_MAX_BYTES: Final = 1024 * 1024 - 4 * 1024
# What the publisher adds to a document as it signs it: the signature (88 characters in
# place of null) and the agent instance it is issued for.
SIGNING_ROOM_BYTES: Final = 1024

_log = structlog.get_logger("greenfed.loop.desired")


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
    secrets: SecretRelease | None,
) -> DesiredTraining:
    workers = node_workers(members)
    node_order = list(workers)
    node_rank = node_order.index(node_id)
    here = workers[node_id]
    node_record = nodes.get(node_id)
    # Secrets go only to a node inside what it enrolled (or was approved) as: one waiting
    # for an admin's approval keeps what it holds, and gets no new copy of any secret.
    public_key = (
        node_record.status.sealing_public_key
        if node_record is not None and not node_record.awaiting_approval
        else None
    )
    return DesiredTraining(
        job_id=record.work_id,
        attempt=record.attempts,
        command=spec.command,
        env=dict(spec.env),
        working_dir=spec.working_dir,
        accelerator_ids=tuple(device for member in here for device in member.accelerator_ids),
        rank=sum(len(workers[other]) for other in node_order[:node_rank]),
        world_size=len(members),
        master_addr=node_address(nodes.get(node_order[0])),
        master_port=master_port(record.work_id, record.attempts, settings),
        grace_period_s=spec.grace_period_s,
        reference_duration_s=spec.estimated_duration_s,
        # A gang is capped whole (power_capping.py): every member on a node has one limit.
        power_limit_w=min(
            (m.power_limit_w for m in here if m.power_limit_w is not None), default=None
        ),
        cpu_cores=_cores(here),
        tenant=record.tenant_id,
        processes=len(here),
        node_rank=node_rank,
        nodes=len(node_order),
        launch=spec.launch,
        host_memory_bytes=spec.host_memory_bytes or None,
        pids_limit=spec.pids_limit,
        min_isolation=stronger_isolation(spec.isolation, settings.min_isolation),
        image=None if spec.image is None else qualified(spec.image),
        image_pull_policy=spec.image_pull_policy,
        secret_names=tuple(sorted(spec.secret_env)),
        # A registry password names no variable: without this the node could not tell
        # a job whose secrets were withheld from one that has none.
        has_secrets=spec.has_secrets,
        sealed_secrets=(
            secrets.sealed(
                spec,
                tenant_id=record.tenant_id,
                node_id=node_id,
                job_id=record.work_id,
                attempt=record.attempts,
                public_key=public_key,
            )
            if secrets is not None
            else None
        ),
    )


def _cores(members: Sequence[AllocationRecord]) -> int | None:
    """The CPU cores a node's worker may use: held beside GPU/NPU devices, or a CPU job's
    accelerators; None where the scheduler holds none."""
    cores = sum(m.accelerators if m.accelerator_kind == "cpu" else m.cpu_cores for m in members)
    return cores or None


def canary_members(spec: DeploymentSpec, members: Sequence[AllocationRecord]) -> frozenset[int]:
    """The replicas that serve a rollout's new model: the lowest replica numbers, at
    least one replica, and at least the deployment's `min_available`, always keeping
    the deployment's model (a canary that fails takes no more than the budget allows;
    with no room for a canary the rollout waits for more replicas).

    Kept within the spec's count as well as the placed replicas: a deployment scaled
    down still holds its surplus until the pass gives it back, and a canary counted
    from those would take all but one of the replicas that remain. A deployment of one
    replica has no canary: its rollout is ended (cloud/loop/rollout.py)."""
    keep = max(1, spec.min_available or 0)
    room = min(len(members), spec.replicas) - keep
    if spec.canary is None or room <= 0:
        return frozenset()
    count = min(spec.canary.replicas, room)
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
    secrets: SecretRelease | None = None,
    agent_upgrade: AgentUpgrade | None = None,
    max_bytes: int = DESIRED_MAX_BYTES - SIGNING_ROOM_BYTES,
) -> DesiredState:
    """Everything stored for `node_id`; `allocations` maps every work id to all of its
    allocations (a gang's other nodes decide this node's ranks); `models` the registry's
    records of the deployments' models, `signer` makes their download URLs; `cluster_id`
    the store's (generations count within it: an agent adopts a new one's sequence);
    `secrets` seals jobs' secrets to the node (None: none are sent, the agent refuses
    such workers); `agent_upgrade` the agent version the node is asked to run
    (cloud/upgrades/); `max_bytes` the most the document may encode to, unsigned (the
    newest work the node does not run gives way, see above)."""
    training: list[DesiredTraining] = []
    deployments: list[DesiredDeployment] = []
    for work_id, members in sorted(allocations.items()):
        here = [member for member in members if member.node_id == node_id]
        record = records.get(work_id)
        if not here or record is None:
            continue
        try:
            spec = spec_of(record)
        except (msgspec.DecodeError, ValueError):
            # Written by a greenfed this one cannot read (a rolling upgrade's newer
            # version): the pass fails it (cloud/loop/plans.py); every other item, and
            # every other node's document, is made as ever.
            continue
        if isinstance(spec, TrainingJobSpec):
            training.append(_training(record, spec, node_id, members, nodes, settings, secrets))
            continue
        assert isinstance(spec, DeploymentSpec)
        canary = canary_members(spec, members)
        deployments.extend(
            _replica(record, spec, member, models or {}, signer, member.member_index in canary)
            for member in here
        )
    document = DesiredState(
        node_id=node_id,
        generation=generation,
        deployments=tuple(deployments),
        training=tuple(training),
        issued_at=now,
        cluster_id=cluster_id,
        agent_upgrade=agent_upgrade,
    )
    return _within(document, max_bytes, records=records, node=nodes.get(node_id))


def _within(
    document: DesiredState,
    max_bytes: int,
    *,
    records: Mapping[str, WorkRecord],
    node: NodeRecord | None,
) -> DesiredState:
    """`document`, or where it encodes to more than `max_bytes` one that does not: the
    training entries the node does not report give way, newest submission first, their
    secrets withheld, then the entries themselves left out."""
    size = len(encode(document))
    if size <= max_bytes:
        return document
    training = list(document.training)
    # The document is its entries' encodings joined by commas: sizes change by theirs.
    sizes = [len(encode(entry)) for entry in training]
    unreported = [
        index
        for index, entry in enumerate(training)
        if node is None or node.training_report(entry.job_id, entry.attempt) is None
    ]
    newest_first = sorted(
        unreported,
        key=lambda index: (_submitted_at(records, training[index].job_id), training[index].job_id),
        reverse=True,
    )
    withheld: list[str] = []
    for index in newest_first:
        if size <= max_bytes:
            break
        entry = training[index]
        if entry.sealed_secrets is None:
            continue
        training[index] = msgspec.structs.replace(entry, sealed_secrets=None)
        lighter = len(encode(training[index]))
        size -= sizes[index] - lighter
        sizes[index] = lighter
        withheld.append(entry.job_id)
    left_out: list[int] = []
    for index in newest_first:
        if size <= max_bytes:
            break
        left_out.append(index)
        comma = 1 if len(left_out) < len(training) else 0  # none once no entry is left
        size -= sizes[index] + comma
    left_out_ids = [training[index].job_id for index in left_out]
    if withheld_ids := [job_id for job_id in withheld if job_id not in left_out_ids]:
        _log.warning(
            "secrets withheld: the node's desired document would exceed its size limit",
            node_id=document.node_id,
            job_ids=withheld_ids,
            limit_bytes=max_bytes,
        )
    if left_out_ids:
        _log.warning(
            "training jobs left out of the node's desired document: it would exceed its size limit",
            node_id=document.node_id,
            job_ids=left_out_ids,
            limit_bytes=max_bytes,
        )
    kept = tuple(entry for index, entry in enumerate(training) if index not in left_out)
    return msgspec.structs.replace(document, training=kept)


def _submitted_at(records: Mapping[str, WorkRecord], work_id: str) -> float:
    record = records.get(work_id)
    return record.submitted_at if record is not None else 0.0
