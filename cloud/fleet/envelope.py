"""What a node may be, held against what its births say (issue 25): nodes are held to
what they enrolled as, the kubelet certificate-approval model.

A node enrols with a join token. The token, or the node where the token says nothing,
fixes its site, zone and region; the token may also fix labels, what work it runs
(training, inference or both) and an inventory ceiling (accelerators per kind, accepted
models, memory per accelerator). That is the node's `NodeEnvelope`, kept with its
enrolment. Its labels are not judged: they are laid over what the node's births declare
(cloud/fleet/well_known_labels.py), which may add labels but not change or drop these.
Its first birth is recorded as its approved `NodeClaim` too: from then on it may not
move (site, zone, region), take up training, nor (where the envelope sets no ceiling)
announce more accelerators or memory without an admin's approval.

A birth outside the envelope, or beyond the approved claim, puts the node in
`pending-approval`: it stays in the registry, visible with the differences, and gets
no new work (nor secrets) until an admin approves what it says now (`greenfed nodes
approve NODE`), which makes that its approved claim. A node nobody enrolled (a
cluster without `cloud.require_enrolment`) has no envelope: only plausibility limits
hold it.

How fast a node's accelerators are and what power they draw is not the node's to
say either: `trusted_speed_and_power` takes them from the control plane's model table
(shared/accelerators.py), unless an admin approved the node's own figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

import msgspec

from shared.accelerators import ACCELERATORS, AcceleratorFacts, nvidia_gpu_facts
from shared.messages import Accelerator, AcceleratorKind, NodeStatus, Site
from shared.mig_profiles import COMPUTE_SLICES, compute_sevenths, mig_profile_of

KINDS: Final[tuple[AcceleratorKind, ...]] = ("gpu", "npu", "cpu")
WorkKinds = Literal["training", "inference", "any"]
# CPUs are not in the model table: a node's own figure for its CPU, no faster than this
# (relative to one A100; the fastest simulated server CPU is 0.1).
MAX_CPU_RELATIVE_SPEED: Final = 0.25


class NodeEnvelope(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a node may be (None, empty: not fixed)."""

    site: Site | None = None
    zone: str | None = None
    region: str | None = None
    # The join token's labels: the node carries them whatever its births declare (empty
    # for a token without labels, and in envelopes stored before they were kept).
    labels: dict[str, str] = {}
    work: WorkKinds = "any"
    # Accelerators per kind at most (a kind not named: none); empty: no ceiling.
    max_accelerators: dict[AcceleratorKind, int] = {}
    accelerator_models: tuple[str, ...] = ()  # accepted models; empty: any
    max_accelerator_memory_bytes: int | None = None

    @property
    def has_ceiling(self) -> bool:
        return bool(
            self.max_accelerators
            or self.accelerator_models
            or self.max_accelerator_memory_bytes is not None
        )


class NodeClaim(msgspec.Struct, frozen=True, kw_only=True):
    """What a birth says of the node, as much as an approval covers."""

    site: Site
    zone: str
    region: str
    runs_training: bool
    # "kind/model" -> how many; the most memory of one accelerator, per kind.
    accelerators: dict[str, int] = {}
    max_memory_bytes: dict[AcceleratorKind, int] = {}
    # An admin approved it (it stands in for the envelope); else the node's first birth
    # said it (it holds beside the envelope).
    by_admin: bool = False


ENVELOPE_DECODER: Final = msgspec.json.Decoder(NodeEnvelope)
CLAIM_DECODER: Final = msgspec.json.Decoder(NodeClaim)


def runs_training(status: NodeStatus) -> bool:
    """What the agent advertises; one older than schema 1.3 runs training exactly when
    its site is cloud (the agent's own default, `AgentSettings.runs_training`)."""
    return status.site == "cloud" if status.runs_training is None else status.runs_training


def claim_of(status: NodeStatus) -> NodeClaim:
    counts: dict[str, int] = {}
    memory: dict[AcceleratorKind, int] = {}
    for accelerator in status.accelerators:
        key = f"{accelerator.kind}/{accelerator.model}"
        counts[key] = counts.get(key, 0) + 1
        memory[accelerator.kind] = max(memory.get(accelerator.kind, 0), accelerator.memory_bytes)
    return NodeClaim(
        site=status.site,
        zone=status.zone,
        region=status.region,
        runs_training=runs_training(status),
        accelerators=counts,
        max_memory_bytes=memory,
    )


def outside_envelope(claim: NodeClaim, envelope: NodeEnvelope) -> list[str]:
    """What the claim says that the envelope does not allow, for people."""
    found = _placement(claim, envelope.site, envelope.zone, envelope.region)
    if envelope.work == "inference" and claim.runs_training:
        found.append("runs training; enrolled for inference only")
    if envelope.work == "training" and not claim.runs_training:
        found.append("runs no training; enrolled for training")
    if envelope.max_accelerators:
        for kind, count in _by_kind(claim).items():
            allowed = envelope.max_accelerators.get(kind, 0)
            if count > allowed:
                found.append(f"{count} {kind} accelerators; at most {allowed}")
    if envelope.accelerator_models:
        for key in sorted(claim.accelerators):
            device_kind, _, model = key.partition("/")
            if device_kind != "cpu" and model not in envelope.accelerator_models:
                found.append(f"{device_kind} model {model!r} is not one it enrolled with")
    ceiling = envelope.max_accelerator_memory_bytes
    if ceiling is not None:
        for kind, memory in sorted(claim.max_memory_bytes.items()):
            if kind != "cpu" and memory > ceiling:
                found.append(f"{kind} memory {_gib(memory)}; at most {_gib(ceiling)}")
    return found


def beyond_approved(claim: NodeClaim, approved: NodeClaim, *, inventory: bool = True) -> list[str]:
    """What the claim says beyond what an admin (or the first birth) approved: where it
    is and what work it runs, and (`inventory`) its accelerators and their memory."""
    found = _placement(claim, approved.site, approved.zone, approved.region)
    if claim.runs_training and not approved.runs_training:
        found.append("runs training; approved for inference only")
    if not inventory:
        return found
    for key, count in sorted(claim.accelerators.items()):
        allowed = approved.accelerators.get(key, 0)
        if count > allowed:
            kind, _, model = key.partition("/")
            found.append(f"{count} {kind} {model!r}; approved {allowed}")
    for kind, memory in sorted(claim.max_memory_bytes.items()):
        allowed_memory = approved.max_memory_bytes.get(kind, 0)
        if memory > allowed_memory:
            found.append(f"{kind} memory {_gib(memory)}; approved {_gib(allowed_memory)}")
    return found


def judge(
    status: NodeStatus, envelope: NodeEnvelope | None, approved: NodeClaim | None
) -> tuple[str, ...]:
    """Why the node waits for an admin's approval (empty: it does not). An admin's
    approved claim is what it is held to; else its envelope, and beside it the claim of
    its first birth: where it is and what work it runs always, its inventory too where
    the envelope sets no ceiling."""
    claim = claim_of(status)
    if approved is not None and approved.by_admin:
        return tuple(beyond_approved(claim, approved))
    found = [] if envelope is None else outside_envelope(claim, envelope)
    if approved is not None:
        ceiling = envelope is not None and envelope.has_ceiling
        found.extend(beyond_approved(claim, approved, inventory=not ceiling))
    return tuple(dict.fromkeys(found))  # once each, in order


def _placement(
    claim: NodeClaim, site: Site | None, zone: str | None, region: str | None
) -> list[str]:
    found = []
    for name, said, fixed in (
        ("site", claim.site, site),
        ("zone", claim.zone, zone),
        ("region", claim.region, region),
    ):
        if fixed is not None and said != fixed:
            found.append(f"{name} {said!r}; enrolled as {fixed!r}")
    return found


def _by_kind(claim: NodeClaim) -> dict[AcceleratorKind, int]:
    counts: dict[AcceleratorKind, int] = {}
    for key, count in claim.accelerators.items():
        kind = next(k for k in KINDS if key.startswith(f"{k}/"))
        counts[kind] = counts.get(kind, 0) + count
    return counts


def _gib(size_bytes: int) -> str:
    return f"{size_bytes / 1024**3:g} GiB"


# ---- figures the control plane trusts ---------------------------------------------------


def _facts(model: str) -> AcceleratorFacts | None:
    return ACCELERATORS.get(model) or nvidia_gpu_facts(model)


def trusted_speed_and_power(
    accelerator: Accelerator, by_id: Mapping[str, Accelerator]
) -> tuple[float | None, float | None, float | None]:
    """(relative speed, idle W, max W) of one accelerator as the control plane takes
    them (None: the kind's default, cloud/loop/nodes.py).

    A model the table knows: its power, and a speed no faster than the table's (a node
    may say it is slower, never faster: it can only lose work by it). A MIG instance:
    its GPU's figures by its share of the GPU (its compute units against the table's,
    else its memory against its GPU's), its speed never above the whole GPU's. A CPU:
    its own speed, no faster than MAX_CPU_RELATIVE_SPEED, and its own power. A model the
    table does not know: the defaults, whatever the node says."""
    if accelerator.kind == "cpu":
        speed = accelerator.relative_speed
        return (
            None if speed is None else min(speed, MAX_CPU_RELATIVE_SPEED),
            accelerator.idle_power_w,
            accelerator.max_power_w,
        )
    parent = by_id.get(accelerator.parent_id) if accelerator.parent_id else None
    facts = _facts(parent.model if parent is not None else accelerator.model)
    if facts is None:
        return None, None, None
    share = 1.0 if not accelerator.parent_id else _share_of_gpu(accelerator, parent, facts)
    table_speed = facts.relative_speed
    claimed = accelerator.relative_speed
    if table_speed is None:
        speed = None
    elif claimed is None:
        speed = table_speed * share
    else:
        speed = min(claimed, table_speed)
    return (
        speed,
        None if facts.idle_power_w is None else facts.idle_power_w * share,
        None if facts.max_power_w is None else facts.max_power_w * share,
    )


def _share_of_gpu(instance: Accelerator, gpu: Accelerator | None, facts: AcceleratorFacts) -> float:
    """A MIG instance's part of its GPU (`facts`: the GPU model's): its compute units
    against the model's, else its memory against its GPU's, else the compute its MIG
    profile names. `gpu`: the physical GPU where the node lists it, which an agent never
    does (docs/mqtt.md): the model table's memory then stands for it."""
    if facts.compute_units and instance.compute_units:
        return min(1.0, instance.compute_units / facts.compute_units)
    gpu_memory_bytes = gpu.memory_bytes if gpu is not None else facts.memory_bytes
    if gpu_memory_bytes and instance.memory_bytes:
        return min(1.0, instance.memory_bytes / gpu_memory_bytes)
    profile = mig_profile_of(instance.model)
    if profile is not None:
        return compute_sevenths(profile) / COMPUTE_SLICES
    return 1.0


def believed_accelerators(
    accelerators: tuple[Accelerator, ...], trust_own_figures: bool
) -> tuple[Accelerator, ...]:
    """The node's accelerators with the speed and power the control plane takes for them
    (`trusted_speed_and_power`), or as the node says where an admin trusts its figures."""
    if trust_own_figures:
        return accelerators
    by_id = {accelerator.id: accelerator for accelerator in accelerators}
    believed = []
    for accelerator in accelerators:
        speed, idle_w, max_w = trusted_speed_and_power(accelerator, by_id)
        if (speed, idle_w, max_w) == (
            accelerator.relative_speed,
            accelerator.idle_power_w,
            accelerator.max_power_w,
        ):
            believed.append(accelerator)
        else:
            believed.append(
                msgspec.structs.replace(
                    accelerator, relative_speed=speed, idle_power_w=idle_w, max_power_w=max_w
                )
            )
    return tuple(believed)
