"""Energy of each allocation from one telemetry sample of its node (pure).

A node's sample covers [previous sample, this sample) of the same agent instance.
Per device, the energy over that step comes from, best first:

1. the difference of its cumulative energy counter (NVML total energy, RAPL), which
   also covers exactly any samples lost on the way (a broker outage, a control-plane
   restart: the counter kept counting);
2. its power sample times the step: a sample's power describes its own interval, so
   beyond ``2 × interval_s`` the rest of the step is a *gap*;
3. the energy model at the sample's utilisation (linear between the device's idle
   and maximum power, `cloud.loop.nodes.device_power_w`), never above the power
   limit its node reports holding the device to for a capped training run
   (`held_power_limits_w`: what the node holds, not what the cloud asked, since a
   node without the permission to set limits runs at its default).

Steps 1 and 2 are *measured*; the model's share is not. A gap (a step longer than
the sample's own interval without a counter, or the time between the last sample
of an agent instance and the first of the next one) is filled by the model at the
new sample's utilisation and counted in ``gap_s``.

A node reports its own counters and power, and its tenants are billed by them. A
power sample, or a counter's difference over the time since that counter last moved,
that would have a device draw more than `PLAUSIBLE_POWER_FACTOR` times the maximum
power it announced (its kind's default where it announced none) cannot be true: that
step is counted as if the node had not said it (the next source down), and the device
is named in `implausible`.

A GPU in MIG mode is announced as its slices (`parent_id` set), and each slice's sample
repeats the whole GPU's power and counter (docs/mqtt.md): the GPU is metered once, from
one slice's figures, judged against its slices' maximum power together
(`SlicedGpu`), and its energy is split among its announced slices by their part of its
compute. A slice held by no allocation bills its part to no one.

An allocation gets its own devices' energy, prorated by how much of the step it
held them, plus a share of the host's. The node's CPU energy is shared once, never
more than measured: CPU work gets the CPU's energy × its cores / the CPU's cores,
and what CPU work leaves is the host of the node's other devices, every kind's
alike: an allocation of ``a`` of them gets that rest × a / (devices of every kind
but the CPU on the node). Cores and devices count for the part of the step they
were held; more held than the node has (which a consistent inventory never shows)
are scaled down to what it has. On a node that reports no CPU the host share is
``host_overhead_ratio`` of the devices' energy. On a node with one kind of
accelerator and no CPU work this is the energy model's host share
(`cloud.green.energy`); that model, an estimate for ranking candidates, gives each
kind the whole CPU (docs/green.md).

A sample older than the mark (a replay, a retained or duplicated copy, a restarted
control plane seeing what it already counted) yields nothing and keeps the mark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

from cloud.loop.nodes import device_power_w
from shared.messages import (
    TRAINING_RUN_LIVE_STATES,
    Accelerator,
    AcceleratorKind,
    AcceleratorSample,
    NodeStatus,
    ReportedState,
    Telemetry,
)
from shared.mig_profiles import compute_sevenths, mig_profile_of
from shared.work_literals import WorkKind

# A step up to this many sample intervals is one sample's (scheduling jitter, a
# dropped QoS-0 sample); beyond, the power sample no longer describes it.
POWER_SAMPLE_REACH = 2.0
DEFAULT_MAX_GAP_S = 6 * 3600.0
# A device's mean draw over a step is believed up to this many times the maximum power
# it announced: far above what a GPU's excursions or a CPU's turbo (Intel's PL2, up to
# about 2.5x its base power on laptops and edge boxes) average to over a step, far below
# what would let a node inflate its tenants' bills or emissions by orders of magnitude.
PLAUSIBLE_POWER_FACTOR = 4.0


# Made once per sample: msgspec structs, which cost a tenth of a frozen dataclass to make.
class NodeMark(msgspec.Struct, frozen=True):
    """What has been counted of a node: up to `sampled_at_s` of one agent instance."""

    instance_id: str
    seq: int
    sampled_at_s: float
    energy_j: Mapping[str, float]  # each device's cumulative counter at that sample
    # Counters that read here what they read at an earlier sample: when they took that
    # value (the others moved at this one, `sampled_at_s`). A counter that moves in steps
    # (a cluster's energy accounting polls every half minute or so) is judged over the
    # time since it last moved, not over one sample's step. Kept in memory only: a mark
    # read back from the store judges from `sampled_at_s`.
    moved_at_s: Mapping[str, float] = msgspec.field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MeteredAllocation:
    work_id: str
    member_index: int
    tenant_id: str
    node_id: str
    accelerator_kind: AcceleratorKind
    accelerators: int  # devices, or cores of a CPU
    accelerator_ids: tuple[str, ...]  # () for CPU work: its cores are not pinned
    work_kind: WorkKind
    started_at_s: float
    ended_at_s: float | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.work_id, self.member_index)


class Increment(msgspec.Struct, frozen=True, kw_only=True):
    allocation: MeteredAllocation
    start_s: float
    end_s: float
    energy_j: float  # facility overhead (PUE) not applied
    measured_j: float  # of which from counters or power samples
    gap_s: float  # seconds of [start, end) filled by the model for lack of telemetry


# A device's energy over a step: (joules, of which measured).
_DeviceEnergy = tuple[float, float]


class SlicedGpu(msgspec.Struct, frozen=True):
    """A GPU in MIG mode, which its node announces as its slices (MIG instances, each
    with `parent_id`), never as itself. Every slice's sample carries the whole GPU's
    power and energy counter, so the GPU is metered once, as `whole`, and its energy is
    split among its slices."""

    whole: Accelerator  # id: the GPU's; idle and maximum power: its slices' together
    plausible_w: float  # its slices' `plausible_power_w` together
    slices: tuple[tuple[Accelerator, float], ...]  # each slice, its share (they sum to 1)


class NodeProfile(msgspec.Struct, frozen=True):
    """What metering needs of a node's inventory, worked out once per birth
    (`profile_of`) rather than at every step: a node's devices change only with a new
    birth, and its steps come every few seconds."""

    inventory: NodeStatus
    # Each device metered on its own (all but MIG slices), its `plausible_power_w`.
    devices: tuple[tuple[Accelerator, float], ...]
    cpu_ids: tuple[str, ...]
    cpu_cores: int  # each CPU's compute units, at least 1
    pool_sizes: Mapping[str, int]  # kind -> devices of that kind
    hosted_devices: int  # devices of every kind but the CPU: what the host serves
    sliced_gpus: tuple[SlicedGpu, ...] = ()  # MIG slices, by their GPU


def profile_of(inventory: NodeStatus) -> NodeProfile:
    pool_sizes: dict[str, int] = {}
    for accelerator in inventory.accelerators:
        pool_sizes[accelerator.kind] = pool_sizes.get(accelerator.kind, 0) + 1
    cpus = [a for a in inventory.accelerators if a.kind == "cpu"]
    return NodeProfile(
        inventory,
        tuple((a, plausible_power_w(a)) for a in inventory.accelerators if a.parent_id is None),
        tuple(a.id for a in cpus),
        sum(max(1, a.compute_units) for a in cpus),
        pool_sizes,
        len(inventory.accelerators) - len(cpus),
        _sliced_gpus(inventory.accelerators),
    )


def _sliced_gpus(accelerators: Sequence[Accelerator]) -> tuple[SlicedGpu, ...]:
    by_gpu: dict[str, list[Accelerator]] = {}
    for accelerator in accelerators:
        if accelerator.parent_id is not None:
            by_gpu.setdefault(accelerator.parent_id, []).append(accelerator)
    return tuple(_sliced_gpu(gpu_id, slices) for gpu_id, slices in by_gpu.items())


def _sliced_gpu(gpu_id: str, slices: Sequence[Accelerator]) -> SlicedGpu:
    powers_w = [device_power_w(accelerator) for accelerator in slices]
    whole = msgspec.structs.replace(
        slices[0],
        id=gpu_id,
        parent_id=None,
        idle_power_w=sum(idle_w for idle_w, _ in powers_w),
        max_power_w=sum(max_w for _, max_w in powers_w),
    )
    weights = _compute_weights(slices)
    total = sum(weights)
    shares = tuple(
        (accelerator, weight / total) for accelerator, weight in zip(slices, weights, strict=True)
    )
    return SlicedGpu(whole, sum(plausible_power_w(accelerator) for accelerator in slices), shares)


def _compute_weights(slices: Sequence[Accelerator]) -> list[int]:
    """Each slice's part of its GPU's compute: its compute units (SMs), else the
    sevenths its MIG profile names (discovery announces 0 SMs where NVML did not say),
    else its memory, else all alike. One measure for every slice of the GPU, or none."""
    if all(accelerator.compute_units > 0 for accelerator in slices):
        return [accelerator.compute_units for accelerator in slices]
    profiles = [mig_profile_of(accelerator.model) for accelerator in slices]
    if all(profile is not None for profile in profiles):
        return [compute_sevenths(profile) for profile in profiles if profile is not None]
    if all(accelerator.memory_bytes > 0 for accelerator in slices):
        return [accelerator.memory_bytes for accelerator in slices]
    return [1] * len(slices)


class _NodeEnergy(msgspec.Struct, frozen=True):
    """A node's energy over a step, per device and as the shares of it need it."""

    devices: Mapping[str, _DeviceEnergy]
    cpu_j: float
    cpu_measured_j: float
    has_cpu: bool
    cpu_cores: int  # each CPU's compute units, at least 1
    pool_sizes: Mapping[str, int]  # kind -> devices of that kind
    hosted_devices: int  # devices of every kind but the CPU


def _node_energy(profile: NodeProfile, devices: Mapping[str, _DeviceEnergy]) -> _NodeEnergy:
    cpu_j = cpu_measured_j = 0.0
    for cpu_id in profile.cpu_ids:
        joules, measured = devices[cpu_id]
        cpu_j += joules
        cpu_measured_j += measured
    return _NodeEnergy(
        devices,
        cpu_j,
        cpu_measured_j,
        bool(profile.cpu_ids),
        profile.cpu_cores,
        profile.pool_sizes,
        profile.hosted_devices,
    )


def held_power_limits_w(
    reported: ReportedState | None, allocations: Sequence[MeteredAllocation]
) -> dict[str, float]:
    """Device id -> the power limit (W) the node reports holding it to, for the
    training among ``allocations`` (the newest attempt's entry of each job)."""
    if reported is None:
        return {}
    held: dict[str, tuple[int, float]] = {}  # job id -> (attempt, limit)
    for entry in reported.training:
        if entry.power_limit_w is None or entry.state not in TRAINING_RUN_LIVE_STATES:
            continue
        known = held.get(entry.job_id)
        if known is None or entry.attempt > known[0]:
            held[entry.job_id] = (entry.attempt, entry.power_limit_w)
    limits: dict[str, float] = {}
    for allocation in allocations:
        if allocation.work_kind != "training" or allocation.work_id not in held:
            continue
        for device_id in allocation.accelerator_ids:
            limits[device_id] = held[allocation.work_id][1]
    return limits


def _modelled_w(
    accelerator: Accelerator, sample: AcceleratorSample | None, limit_w: float | None = None
) -> float:
    idle_w, max_w = device_power_w(accelerator)
    busy = sample.utilization_pct / 100.0 if sample is not None else 0.0
    modelled_w = idle_w + (max_w - idle_w) * busy
    return modelled_w if limit_w is None else min(modelled_w, limit_w)


def _step_energy(
    accelerator: Accelerator,
    plausible_w: float,
    sample: AcceleratorSample | None,
    previous_counter_j: float | None,
    step_s: float,
    interval_s: float,
    limit_w: float | None,
    implausible: list[str] | None,
    counter_window_s: float,
) -> tuple[float, float, float]:
    """(joules over the step, of which measured, seconds of it that are a gap);
    `plausible_w`: its `plausible_power_w`; `implausible` gets the device's id where
    the node's figure was refused;
    `counter_window_s`: the time since the previous counter value first appeared (at
    least the step)."""
    if (
        sample is not None
        and sample.energy_j is not None
        and previous_counter_j is not None
        and sample.energy_j >= previous_counter_j
    ):
        delta = sample.energy_j - previous_counter_j
        if delta <= plausible_w * counter_window_s:
            return delta, delta, 0.0
        if implausible is not None:
            implausible.append(accelerator.id)
    reach_s = POWER_SAMPLE_REACH * interval_s
    power_w = sample.power_w if sample is not None else None
    if power_w is not None and power_w > plausible_w:
        if implausible is not None:
            implausible.append(accelerator.id)
        power_w = None
    if power_w is not None:
        if step_s <= reach_s:
            joules = power_w * step_s
            return joules, joules, 0.0
        measured = power_w * interval_s
        gap_s = step_s - interval_s
        return measured + _modelled_w(accelerator, sample, limit_w) * gap_s, measured, gap_s
    gap_s = max(0.0, step_s - reach_s)
    return _modelled_w(accelerator, sample, limit_w) * step_s, 0.0, gap_s


def _sliced_gpu_step(
    gpu: SlicedGpu,
    samples: Mapping[str, AcceleratorSample],
    counters: Mapping[str, float],
    moved_at_s: Mapping[str, float],
    marked_s: float,
    end_s: float,
    step_s: float,
    interval_s: float,
    power_limits_w: Mapping[str, float],
    implausible: list[str] | None,
) -> tuple[float, float, float]:
    """`_step_energy` of a GPU in MIG mode, metered once from one of its slices' samples
    (`implausible` gets the GPU's id)."""
    slice_id, sample = _gpu_sample(gpu, samples, counters)
    return _step_energy(
        gpu.whole,
        gpu.plausible_w,
        sample,
        counters.get(slice_id),
        step_s,
        interval_s,
        _gpu_limit_w(gpu, power_limits_w),
        implausible,
        end_s - moved_at_s.get(slice_id, marked_s),
    )


def _gpu_sample(
    gpu: SlicedGpu, samples: Mapping[str, AcceleratorSample], counters: Mapping[str, float]
) -> tuple[str, AcceleratorSample | None]:
    """The slice whose sample stands for its GPU's (the first with a counter to compare,
    else the first sampled), and that sample as the GPU's: at its slices' utilisation,
    weighted by their shares (a slice not sampled counts as idle). ("", None) where no
    slice was sampled."""
    chosen_id = ""
    chosen: AcceleratorSample | None = None
    utilization_pct = 0.0
    for accelerator, share in gpu.slices:
        sample = samples.get(accelerator.id)
        if sample is None:
            continue
        utilization_pct += sample.utilization_pct * share
        if chosen is None or (
            not _has_counter(chosen_id, chosen, counters)
            and _has_counter(accelerator.id, sample, counters)
        ):
            chosen_id, chosen = accelerator.id, sample
    if chosen is None:
        return chosen_id, None
    return chosen_id, msgspec.structs.replace(
        chosen, id=gpu.whole.id, utilization_pct=utilization_pct
    )


def _has_counter(device_id: str, sample: AcceleratorSample, counters: Mapping[str, float]) -> bool:
    return sample.energy_j is not None and device_id in counters


def _gpu_limit_w(gpu: SlicedGpu, power_limits_w: Mapping[str, float]) -> float | None:
    """The lowest limit the node reports holding any of the GPU's slices to: NVML
    limits power per physical GPU, so a slice's limit is its whole GPU's."""
    if not power_limits_w:
        return None
    limits_w = [power_limits_w[a.id] for a, _ in gpu.slices if a.id in power_limits_w]
    return min(limits_w) if limits_w else None


def _split(gpu: SlicedGpu, energy: _DeviceEnergy, devices: dict[str, _DeviceEnergy]) -> None:
    """Each slice's share of its GPU's energy, into `devices`."""
    joules, measured = energy
    for accelerator, share in gpu.slices:
        devices[accelerator.id] = (joules * share, measured * share)


def plausible_power_w(accelerator: Accelerator) -> float:
    """The most a device's mean draw over a step may be believed to be, in watts."""
    _, max_w = device_power_w(accelerator)
    if max_w <= 0:  # a maximum of nothing is no maximum: its kind's default, as if unsaid
        _, max_w = device_power_w(msgspec.structs.replace(accelerator, max_power_w=None))
    return PLAUSIBLE_POWER_FACTOR * max_w


def believed_power_w(accelerator: Accelerator, sample: AcceleratorSample) -> float | None:
    """A device's power sample as metering believes it: None where it gave none, the
    model's figure at its utilisation where it claims more than the device can draw."""
    power_w = sample.power_w
    if power_w is None or power_w <= plausible_power_w(accelerator):
        return power_w
    return _modelled_w(accelerator, sample)


def believed_gpu_power_w(
    slices: Sequence[tuple[Accelerator, AcceleratorSample]],
) -> float | None:
    """The power of one GPU in MIG mode from its slices' samples, as metering believes
    it (`SlicedGpu`): every slice's sample repeats the GPU's, which counts once, up to
    what its slices together can draw; the model's figure at their utilisation where it
    claims more. None where no slice gave a figure."""
    power_w = next((s.power_w for _, s in slices if s.power_w is not None), None)
    if power_w is None or power_w <= sum(plausible_power_w(a) for a, _ in slices):
        return power_w
    return sum(_modelled_w(accelerator, sample) for accelerator, sample in slices)


def _held(allocation: MeteredAllocation, start_s: float, end_s: float) -> tuple[float, float]:
    """The part of [start, end) the allocation held its devices (empty: start >= end)."""
    ended = allocation.ended_at_s if allocation.ended_at_s is not None else end_s
    return max(start_s, allocation.started_at_s), min(end_s, ended)


# How a span's CPU energy is shared: the part of it per core of CPU work and per
# device of another kind (`_host_parts`).
_HostParts = tuple[float, float]
_NO_HOST_PARTS: _HostParts = (0.0, 0.0)


def _host_parts(
    allocations: Sequence[MeteredAllocation], node: _NodeEnergy, start_s: float, end_s: float
) -> _HostParts:
    """CPU work gets its cores' part of the CPU; the rest is the host of every other
    device, whatever its kind. So the shares add up to at most the CPU's energy: giving
    each kind's devices the whole CPU (the energy model's estimate) would bill it once
    per kind, and once more to CPU work. Cores and devices count for the part of
    [start, end) they were held; more than the node has are scaled down to what it has."""
    cores, devices = node.cpu_cores, node.hosted_devices
    if not node.has_cpu or cores <= 0:
        return _NO_HOST_PARTS
    span_s = end_s - start_s
    cores_held = devices_held = 0.0
    for allocation in allocations:
        held_start_s, held_end_s = _held(allocation, start_s, end_s)
        if held_end_s <= held_start_s:
            continue
        part = (held_end_s - held_start_s) / span_s
        if allocation.accelerator_kind == "cpu":
            cores_held += min(allocation.accelerators, cores) * part
        elif node.pool_sizes.get(allocation.accelerator_kind, 0):
            devices_held += min(allocation.accelerators, devices) * part
    per_core = 1.0 / max(cores, cores_held)
    left = 1.0 - min(cores_held, cores) / cores
    per_device = left / max(devices, devices_held) if devices else 0.0
    return per_core, per_device


def _share(
    allocation: MeteredAllocation,
    node: _NodeEnergy,
    host_overhead_ratio: float,
    host_parts: _HostParts,
) -> _DeviceEnergy:
    """The allocation's energy over the whole step, had it held its devices throughout;
    `host_parts`: the step's (`_host_parts`)."""
    if allocation.accelerator_kind == "cpu":
        part = min(allocation.accelerators, node.cpu_cores) * host_parts[0]
        return node.cpu_j * part, node.cpu_measured_j * part
    devices = node.devices
    device_j = device_measured_j = 0.0
    for device_id in allocation.accelerator_ids:
        energy = devices.get(device_id)
        if energy is not None:
            device_j += energy[0]
            device_measured_j += energy[1]
    if not node.has_cpu:
        return device_j * (1.0 + host_overhead_ratio), device_measured_j * (
            1.0 + host_overhead_ratio
        )
    # An allocation of a kind the node has none of is served by no host.
    if not node.pool_sizes.get(allocation.accelerator_kind, 0):
        return device_j, device_measured_j
    part = min(allocation.accelerators, node.hosted_devices) * host_parts[1]
    return device_j + node.cpu_j * part, device_measured_j + node.cpu_measured_j * part


def mark_of(telemetry: Telemetry, previous: NodeMark | None = None) -> NodeMark:
    """What has been counted once `telemetry` is (`previous`: the mark before it)."""
    energy_j = {s.id: s.energy_j for s in telemetry.accelerators if s.energy_j is not None}
    moved_at_s: dict[str, float] = {}
    if previous is not None and previous.instance_id == telemetry.instance_id:
        before = previous.energy_j
        for device, joules in energy_j.items():
            if before.get(device) == joules:  # has not moved: since when
                moved_at_s[device] = previous.moved_at_s.get(device, previous.sampled_at_s)
    return NodeMark(
        telemetry.instance_id, telemetry.seq, telemetry.sampled_at, energy_j, moved_at_s
    )


def is_replay(telemetry: Telemetry, mark: NodeMark | None) -> bool:
    """Whether the sample was counted already (or is older than what was)."""
    if mark is None:
        return False
    sampled_at_s = telemetry.sampled_at
    if sampled_at_s <= mark.sampled_at_s:
        return True
    return telemetry.instance_id == mark.instance_id and telemetry.seq <= mark.seq


def meter(
    inventory: NodeStatus,
    telemetry: Telemetry,
    mark: NodeMark | None,
    allocations: Sequence[MeteredAllocation],
    *,
    host_overhead_ratio: float = 0.1,
    max_gap_s: float = DEFAULT_MAX_GAP_S,
    power_limits_w: Mapping[str, float] | None = None,
    implausible: list[str] | None = None,
    profile: NodeProfile | None = None,
) -> tuple[list[Increment], NodeMark | None]:
    """The increments of the node's allocations since `mark`, and the new mark (the old
    one for a replay). ``power_limits_w``: device id -> the limit its node holds it to
    (`held_power_limits_w`), which bounds the model's figure. ``implausible`` gets the
    id of each device whose counter or power this step was refused. ``profile``: the
    inventory's (`profile_of`), where the caller keeps one."""
    power_limits_w = power_limits_w or {}
    if is_replay(telemetry, mark):
        return [], mark
    end_s = telemetry.sampled_at
    interval_s = telemetry.interval_s
    samples = {sample.id: sample for sample in telemetry.accelerators}
    same_instance = mark is not None and mark.instance_id == telemetry.instance_id
    new_mark = mark_of(telemetry, mark)
    moved_at_s: Mapping[str, float]
    if same_instance:
        assert mark is not None
        start_s = mark.sampled_at_s
        counters: Mapping[str, float] = mark.energy_j
        moved_at_s = mark.moved_at_s
    else:
        # A new instance's first sample covers its own interval, but never what the
        # previous instance's last one did: an agent samples as soon as it starts.
        start_s = end_s - interval_s
        if mark is not None:
            start_s = max(start_s, mark.sampled_at_s)
        counters = moved_at_s = {}
    marked_s = start_s  # a counter that moved at the mark is judged from there
    # Between the last sample of a previous instance and this one's first interval.
    gap_start_s = None
    if mark is not None and not same_instance and mark.sampled_at_s < start_s:
        gap_start_s = max(mark.sampled_at_s, start_s - max_gap_s)
    start_s = max(start_s, end_s - max_gap_s)
    step_s = end_s - start_s
    if step_s <= 0 or not allocations:
        return [], new_mark
    if profile is None or profile.inventory is not inventory:
        profile = profile_of(inventory)
    devices: dict[str, _DeviceEnergy] = {}
    step_gap_s = 0.0
    for accelerator, plausible_w in profile.devices:
        joules, measured, gap_s = _step_energy(
            accelerator,
            plausible_w,
            samples.get(accelerator.id),
            counters.get(accelerator.id),
            step_s,
            interval_s,
            power_limits_w.get(accelerator.id),
            implausible,
            end_s - moved_at_s.get(accelerator.id, marked_s),
        )
        devices[accelerator.id] = (joules, measured)
        if gap_s > step_gap_s:
            step_gap_s = gap_s
    for gpu in profile.sliced_gpus:
        joules, measured, gap_s = _sliced_gpu_step(
            gpu,
            samples,
            counters,
            moved_at_s,
            marked_s,
            end_s,
            step_s,
            interval_s,
            power_limits_w,
            implausible,
        )
        _split(gpu, (joules, measured), devices)
        if gap_s > step_gap_s:
            step_gap_s = gap_s
    node = _node_energy(profile, devices)
    host_parts = _host_parts(allocations, node, start_s, end_s)
    increments: list[Increment] = []
    for allocation in allocations:
        held_start_s, held_end_s = _held(allocation, start_s, end_s)
        if held_end_s > held_start_s:
            whole_j, whole_measured_j = _share(allocation, node, host_overhead_ratio, host_parts)
            part = (held_end_s - held_start_s) / step_s
            increments.append(
                Increment(
                    allocation=allocation,
                    start_s=held_start_s,
                    end_s=held_end_s,
                    energy_j=whole_j * part,
                    measured_j=whole_measured_j * part,
                    gap_s=step_gap_s * part,
                )
            )
    if gap_start_s is not None:
        increments.extend(
            _gap_increments(
                profile,
                samples,
                allocations,
                gap_start_s,
                start_s,
                host_overhead_ratio,
                power_limits_w,
            )
        )
    return increments, new_mark


def _gap_increments(
    profile: NodeProfile,
    samples: Mapping[str, AcceleratorSample],
    allocations: Sequence[MeteredAllocation],
    start_s: float,
    end_s: float,
    host_overhead_ratio: float,
    power_limits_w: Mapping[str, float],
) -> list[Increment]:
    """The model's energy over [start, end), a time no sample of any instance covers."""
    span_s = end_s - start_s
    modelled: dict[str, _DeviceEnergy] = {
        a.id: (_modelled_w(a, samples.get(a.id), power_limits_w.get(a.id)) * span_s, 0.0)
        for a, _ in profile.devices
    }
    for gpu in profile.sliced_gpus:
        _, sample = _gpu_sample(gpu, samples, {})
        limit_w = _gpu_limit_w(gpu, power_limits_w)
        _split(gpu, (_modelled_w(gpu.whole, sample, limit_w) * span_s, 0.0), modelled)
    node = _node_energy(profile, modelled)
    host_parts = _host_parts(allocations, node, start_s, end_s)
    result = []
    for allocation in allocations:
        held_start_s, held_end_s = _held(allocation, start_s, end_s)
        if held_end_s > held_start_s:
            whole_j, _ = _share(allocation, node, host_overhead_ratio, host_parts)
            held_s = held_end_s - held_start_s
            result.append(
                Increment(
                    allocation=allocation,
                    start_s=held_start_s,
                    end_s=held_end_s,
                    energy_j=whole_j * held_s / span_s,
                    measured_j=0.0,
                    gap_s=held_s,
                )
            )
    return result


def silent_samples(
    profile: NodeProfile,
    last: Telemetry | None,
    allocations: Sequence[MeteredAllocation],
    assumed_utilisation_pct: Mapping[WorkKind, float],
) -> dict[str, AcceleratorSample]:
    """What the model takes a node that fell silent to have run at: its last sample's
    utilisation (as a gap before a sample takes that sample's), and where it never
    sampled a device, the utilisation the energy model assumes of the work holding it
    (`assumed_utilisation_pct`), the busiest of the node's work for its CPU. Modelled at
    idle, a node that never reports would bill its tenants' work as next to nothing."""
    samples = {sample.id: sample for sample in last.accelerators} if last is not None else {}
    assumed: dict[str, float] = {}
    busiest_pct = 0.0
    for allocation in allocations:
        utilisation_pct = assumed_utilisation_pct.get(allocation.work_kind, 0.0)
        busiest_pct = max(busiest_pct, utilisation_pct)
        for device_id in allocation.accelerator_ids:
            assumed[device_id] = max(assumed.get(device_id, 0.0), utilisation_pct)
    for cpu_id in profile.cpu_ids:  # CPU work's cores are not pinned: the whole CPU
        assumed.setdefault(cpu_id, busiest_pct)
    for device_id, utilisation_pct in assumed.items():
        if device_id not in samples:
            samples[device_id] = AcceleratorSample(
                id=device_id, utilization_pct=utilisation_pct, memory_used_bytes=0
            )
    return samples


def silent_increments(
    profile: NodeProfile,
    samples: Mapping[str, AcceleratorSample],
    allocations: Sequence[MeteredAllocation],
    start_s: float,
    end_s: float,
    *,
    host_overhead_ratio: float = 0.1,
    power_limits_w: Mapping[str, float] | None = None,
) -> list[Increment]:
    """The model's energy over [start, end) of a node that said nothing of it (its
    allocations there ended, and no sample came to count them to their end): a gap,
    as between two samples, counted in `gap_s` (`samples`: `silent_samples`)."""
    if end_s <= start_s:
        return []
    return _gap_increments(
        profile, samples, allocations, start_s, end_s, host_overhead_ratio, power_limits_w or {}
    )


def silent_mark(mark: NodeMark | None, counted_until_s: float) -> NodeMark:
    """The node's mark once the model counted it to `counted_until_s` for lack of
    samples: a later sample counts only the time after. Its counters are dropped: their
    difference at the next sample would span the modelled time too, counted twice; that
    sample's step is measured by its power instead. Without a mark, an instance no agent
    has: the next sample is a new instance's, whose first interval starts no earlier."""
    if mark is None:
        return NodeMark("", 0, counted_until_s, {})
    return NodeMark(mark.instance_id, mark.seq, counted_until_s, {})
