"""The meter and the hourly split held to their rules written out plainly, on random
nodes, samples, marks and allocations (cloud/usage/meter.py, cloud/usage/pricing.py).

Metering runs on every sample the leader hears, so its code is written for speed; what
it must compute is stated here the slow, obvious way, from the module docstrings: a
device's energy from its counter's difference, else its power sample over the step (up
to `POWER_SAMPLE_REACH` intervals, the rest modelled as a gap), else the model, a
counter or power sample believed only up to `PLAUSIBLE_POWER_FACTOR` times the device's
announced maximum power; an
allocation's own devices prorated by the time it held them, plus its part of the CPU's
energy: CPU work its cores' part, and what CPU work leaves shared by every other device,
whatever its kind (or `host_overhead_ratio` of its devices' where no CPU reports), so
that no joule of the CPU is billed twice; a gap between agent instances filled by the
model; every increment split at the hour boundaries of both clocks.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cloud.loop.nodes import device_power_w
from cloud.signals.grid import HOUR_S
from cloud.usage.meter import (
    PLAUSIBLE_POWER_FACTOR,
    POWER_SAMPLE_REACH,
    Increment,
    MeteredAllocation,
    NodeMark,
    meter,
)
from cloud.usage.pricing import Pieces, Priced, accumulate
from shared.messages import (
    Accelerator,
    AcceleratorKind,
    AcceleratorSample,
    HostInfo,
    NodeStatus,
    Telemetry,
)

GIB = 1024**3
T0 = 1_700_000_000.0 - 1_700_000_000.0 % 3600


def _device(device_id: str, kind: AcceleratorKind, units: int) -> Accelerator:
    return Accelerator(
        id=device_id, kind=kind, vendor="v", model="m", memory_bytes=GIB, compute_units=units,
        idle_power_w=40.0 + units, max_power_w=300.0 + units,
    )  # fmt: skip


DEVICES: dict[str, tuple[AcceleratorKind, int]] = {
    "cpu0": ("cpu", 32),
    "cpu1": ("cpu", 8),
    "gpu0": ("gpu", 108),
    "gpu1": ("gpu", 108),
    "gpu2": ("gpu", 80),
    "npu0": ("npu", 4),
}


@dataclass(frozen=True)
class Case:
    inventory: NodeStatus
    telemetry: Telemetry
    mark: NodeMark | None
    allocations: list[MeteredAllocation]
    host_overhead_ratio: float
    max_gap_s: float
    power_limits_w: dict[str, float]


Row = tuple[str, float, float, float, float, float]  # work, start, end, joules, measured, gap


@st.composite
def cases(draw: st.DrawFn) -> Case:
    ids = draw(st.lists(st.sampled_from(sorted(DEVICES)), min_size=1, max_size=5, unique=True))
    inventory = NodeStatus(
        node_id="n1", state="online", instance_id="i1", agent_version="t", site="cloud",
        zone="DE", region="r",
        host=HostInfo(hostname="h", os="Linux", arch="x86_64", cpu_logical_cores=32,
                      memory_total_bytes=64 * GIB),
        accelerators=tuple(_device(i, *DEVICES[i]) for i in ids),
        telemetry_interval_s=10.0, started_at=T0, sent_at=T0,
    )  # fmt: skip
    interval_s = draw(st.sampled_from([5.0, 10.0, 60.0]))
    sampled_ids = draw(st.lists(st.sampled_from([*ids, "gpu9"]), max_size=6, unique=True))
    maybe_watts = st.none() | st.floats(0.0, 2000.0)  # 4 x max is 1,200-1,700 W here
    telemetry = Telemetry(
        node_id="n1", instance_id=draw(st.sampled_from(["i1", "i2"])),
        seq=draw(st.integers(1, 50)), sampled_at=T0 + draw(st.floats(1.0, 30_000.0)),
        interval_s=interval_s, cpu_utilization_pct=10.0, memory_used_bytes=GIB,
        memory_total_bytes=64 * GIB,
        accelerators=tuple(
            AcceleratorSample(
                id=i, utilization_pct=draw(st.floats(0.0, 100.0)), memory_used_bytes=0,
                power_w=draw(maybe_watts), energy_j=draw(st.none() | st.floats(0.0, 1e7)),
            )
            for i in sampled_ids
        ),
    )  # fmt: skip
    mark = None
    if draw(st.booleans()):
        marked_at = draw(st.floats(T0 - 30_000.0, T0 + 30_000.0))
        mark = NodeMark(
            instance_id=draw(st.sampled_from(["i1", "i2"])),
            seq=draw(st.integers(0, 50)),
            sampled_at_s=marked_at,
            energy_j=draw(st.dictionaries(st.sampled_from(ids), st.floats(0.0, 1e7), max_size=4)),
            moved_at_s=draw(
                st.dictionaries(
                    st.sampled_from(ids), st.floats(marked_at - 600.0, marked_at), max_size=4
                )
            ),
        )
    allocations = []
    for number in range(draw(st.integers(0, 3))):
        kind: AcceleratorKind = draw(st.sampled_from(["gpu", "cpu", "npu"]))
        own = tuple(draw(st.lists(st.sampled_from([*ids, "gpu9"]), max_size=3, unique=True)))
        started = T0 + draw(st.floats(-40_000.0, 30_000.0))
        ended = draw(st.none() | st.floats(started, started + 40_000.0))
        allocations.append(
            MeteredAllocation(
                work_id=f"w{number}", member_index=0, tenant_id="t", node_id="n1",
                accelerator_kind=kind, accelerators=draw(st.integers(1, 40)),
                accelerator_ids=() if kind == "cpu" else own, work_kind="training",
                started_at_s=started, ended_at_s=ended,
            )
        )  # fmt: skip
    return Case(
        inventory=inventory,
        telemetry=telemetry,
        mark=mark,
        allocations=allocations,
        host_overhead_ratio=draw(st.floats(0.0, 0.5)),
        max_gap_s=draw(st.sampled_from([60.0, 3600.0, 6 * 3600.0])),
        power_limits_w=draw(st.dictionaries(st.sampled_from(ids), st.floats(10.0, 400.0))),
    )


def _modelled_w(
    device: Accelerator, sample: AcceleratorSample | None, limit: float | None
) -> float:
    idle_w, max_w = device_power_w(device)
    watts = idle_w + (max_w - idle_w) * (sample.utilization_pct / 100.0 if sample else 0.0)
    return watts if limit is None else min(watts, limit)


def _device_energy(
    device: Accelerator,
    sample: AcceleratorSample | None,
    counter: float | None,
    step_s: float,
    interval_s: float,
    limit: float | None,
    counter_moved_s: float,
) -> tuple[float, float, float]:
    """(joules, of which measured, gap seconds) of one device over the step;
    `counter_moved_s`: the time since the counter last moved before it."""
    assert device.max_power_w is not None
    believable_w = PLAUSIBLE_POWER_FACTOR * device.max_power_w
    counted = sample.energy_j if sample else None
    if (
        counted is not None
        and counter is not None
        and 0 <= counted - counter <= believable_w * max(step_s, counter_moved_s)
    ):
        return counted - counter, counted - counter, 0.0
    reach_s = POWER_SAMPLE_REACH * interval_s
    power_w = sample.power_w if sample else None
    if power_w is not None and power_w <= believable_w:
        if step_s <= reach_s:
            return power_w * step_s, power_w * step_s, 0.0
        gap_s = step_s - interval_s
        measured = power_w * interval_s
        return measured + _modelled_w(device, sample, limit) * gap_s, measured, gap_s
    return _modelled_w(device, sample, limit) * step_s, 0.0, max(0.0, step_s - reach_s)


def _held_part(allocation: MeteredAllocation, start_s: float, end_s: float) -> float:
    """How much of [start, end) the allocation held its devices (0 to 1)."""
    held_start = max(start_s, allocation.started_at_s)
    held_end = min(end_s, allocation.ended_at_s if allocation.ended_at_s is not None else end_s)
    return max(0.0, held_end - held_start) / (end_s - start_s)


def _allocation_energy(
    allocation: MeteredAllocation,
    allocations: Sequence[MeteredAllocation],
    devices: Sequence[Accelerator],
    energy: Mapping[str, tuple[float, float]],
    host_overhead_ratio: float,
    start_s: float,
    end_s: float,
) -> tuple[float, float]:
    """(joules, measured) had the allocation held its devices the whole of [start, end),
    which `allocations` (this one among them) share."""
    cpus = [d for d in devices if d.kind == "cpu"]
    cpu = [sum(energy[d.id][k] for d in cpus) for k in (0, 1)]
    cores = sum(max(1, d.compute_units) for d in cpus)
    hosted = len(devices) - len(cpus)  # every kind's devices but the CPU
    kinds = {d.kind for d in devices}
    # Held on average over the span; no allocation counts for more than the node has.
    cores_held = sum(
        min(a.accelerators, cores) * _held_part(a, start_s, end_s)
        for a in allocations
        if a.accelerator_kind == "cpu"
    )
    devices_held = sum(
        min(a.accelerators, hosted) * _held_part(a, start_s, end_s)
        for a in allocations
        if a.accelerator_kind != "cpu" and a.accelerator_kind in kinds
    )
    if allocation.accelerator_kind == "cpu":
        # Its cores' part of the CPU (of the cores held, where they are more).
        part = min(allocation.accelerators, cores) / max(cores, cores_held) if cores else 0.0
        return cpu[0] * part, cpu[1] * part
    own = [sum(energy[i][k] for i in allocation.accelerator_ids if i in energy) for k in (0, 1)]
    if not cpus:
        return own[0] * (1.0 + host_overhead_ratio), own[1] * (1.0 + host_overhead_ratio)
    if allocation.accelerator_kind not in kinds:
        return own[0], own[1]
    # What CPU work leaves of the CPU, shared by every device of every other kind.
    left = 1.0 - min(cores_held, cores) / cores
    part = left * min(allocation.accelerators, hosted) / max(hosted, devices_held)
    return own[0] + cpu[0] * part, own[1] + cpu[1] * part


def _spread(
    allocations: Sequence[MeteredAllocation],
    devices: Sequence[Accelerator],
    energy: Mapping[str, tuple[float, float]],
    host_overhead_ratio: float,
    start_s: float,
    end_s: float,
    gap_s: float | None,
) -> list[Row]:
    """Each allocation's part of [start, end): (work, start, end, joules, measured, gap);
    `gap_s` None: the whole held time is a gap."""
    span_s = end_s - start_s
    rows = []
    for allocation in allocations:
        held_start = max(start_s, allocation.started_at_s)
        held_end = min(end_s, allocation.ended_at_s if allocation.ended_at_s is not None else end_s)
        if held_end <= held_start:
            continue
        joules, measured = _allocation_energy(
            allocation, allocations, devices, energy, host_overhead_ratio, start_s, end_s
        )
        part = (held_end - held_start) / span_s
        gap = held_end - held_start if gap_s is None else gap_s * part
        rows.append((allocation.work_id, held_start, held_end, joules * part, measured * part, gap))
    return rows


def _expected(case: Case) -> tuple[list[Row], NodeMark | None]:
    telemetry, mark, allocations = case.telemetry, case.mark, case.allocations
    ratio, max_gap_s, limits = case.host_overhead_ratio, case.max_gap_s, case.power_limits_w
    end_s = telemetry.sampled_at
    if mark is not None and (
        end_s <= mark.sampled_at_s
        or (telemetry.instance_id == mark.instance_id and telemetry.seq <= mark.seq)
    ):
        return [], mark  # a replay
    counted = {s.id: s.energy_j for s in telemetry.accelerators if s.energy_j is not None}
    same = mark is not None and mark.instance_id == telemetry.instance_id
    # A counter that still reads what the mark has keeps when it took that value; the
    # others moved at this sample (no entry: the mark's own time).
    moved = {
        device: mark.moved_at_s.get(device, mark.sampled_at_s)
        for device, value in counted.items()
        if same and mark is not None and mark.energy_j.get(device) == value
    }
    new_mark = NodeMark(telemetry.instance_id, telemetry.seq, end_s, counted, moved)
    start_s = mark.sampled_at_s if same and mark is not None else end_s - telemetry.interval_s
    counters = mark.energy_j if same and mark is not None else {}
    last_moved = mark.moved_at_s if same and mark is not None else {}
    marked_s = start_s
    gap_from = None
    if mark is not None and not same and mark.sampled_at_s < start_s:
        gap_from = max(mark.sampled_at_s, start_s - max_gap_s)
    start_s = max(start_s, end_s - max_gap_s)
    if end_s - start_s <= 0 or not allocations:
        return [], new_mark
    samples = {s.id: s for s in telemetry.accelerators}
    devices = case.inventory.accelerators
    per_device = {
        d.id: _device_energy(
            d, samples.get(d.id), counters.get(d.id), end_s - start_s, telemetry.interval_s,
            limits.get(d.id), end_s - last_moved.get(d.id, marked_s),
        )
        for d in devices
    }  # fmt: skip
    step_gap_s = max([0.0, *(gap for _, _, gap in per_device.values())])
    energy = {i: (joules, measured) for i, (joules, measured, _) in per_device.items()}
    rows = _spread(allocations, devices, energy, ratio, start_s, end_s, step_gap_s)
    if gap_from is not None:
        span_s = start_s - gap_from
        modelled = {
            d.id: (_modelled_w(d, samples.get(d.id), limits.get(d.id)) * span_s, 0.0)
            for d in devices
        }
        rows += [
            (work, start, end, joules, 0.0, gap)
            for work, start, end, joules, _, gap in _spread(
                allocations, devices, modelled, ratio, gap_from, start_s, None
            )
        ]
    return rows, new_mark


def _as_rows(increments: Sequence[Increment]) -> list[Row]:
    return [
        (i.allocation.work_id, i.start_s, i.end_s, i.energy_j, i.measured_j, i.gap_s)
        for i in increments
    ]


@settings(max_examples=400, deadline=None)
@given(case=cases())
def test_meter_follows_its_rules(case: Case) -> None:
    expected_rows, expected_mark = _expected(case)
    increments, new_mark = meter(
        case.inventory,
        case.telemetry,
        case.mark,
        case.allocations,
        host_overhead_ratio=case.host_overhead_ratio,
        max_gap_s=case.max_gap_s,
        power_limits_w=case.power_limits_w,
    )
    rows = _as_rows(increments)
    assert [row[:3] for row in rows] == [row[:3] for row in expected_rows]
    for row, expected in zip(rows, expected_rows, strict=True):
        assert row[3:] == pytest.approx(expected[3:], rel=1e-12, abs=1e-9)
    assert new_mark == expected_mark


SharedNode = tuple[NodeStatus, Telemetry, NodeMark, list[MeteredAllocation]]


@st.composite
def shared_nodes(draw: st.DrawFn) -> SharedNode:
    """A node with a CPU whose devices' counters all moved over one 10 s step, and work
    that shares it: every other device held by at most one allocation, CPU work holding
    any number of cores (more than there are, too), each for any part of the step."""
    others = draw(st.lists(st.sampled_from(["cpu1", "gpu0", "gpu1", "gpu2", "npu0"]), unique=True))
    ids = ["cpu0", *others]
    inventory = NodeStatus(
        node_id="n1", state="online", instance_id="i1", agent_version="t", site="cloud",
        zone="DE", region="r",
        host=HostInfo(hostname="h", os="Linux", arch="x86_64", cpu_logical_cores=32,
                      memory_total_bytes=64 * GIB),
        accelerators=tuple(_device(i, *DEVICES[i]) for i in ids),
        telemetry_interval_s=10.0, started_at=T0, sent_at=T0,
    )  # fmt: skip
    telemetry = Telemetry(
        node_id="n1", instance_id="i1", seq=2, sampled_at=T0 + 10.0, interval_s=10.0,
        cpu_utilization_pct=10.0, memory_used_bytes=GIB, memory_total_bytes=64 * GIB,
        accelerators=tuple(
            AcceleratorSample(
                id=i, utilization_pct=50.0, memory_used_bytes=0,
                energy_j=draw(st.floats(0.0, 3000.0)),  # at most 300 W: believed
            )
            for i in ids
        ),
    )  # fmt: skip
    mark = NodeMark("i1", 1, T0, dict.fromkeys(ids, 0.0))
    held_from = st.floats(T0 - 10.0, T0 + 9.0)
    allocations = []
    owners: dict[tuple[int, AcceleratorKind], list[str]] = {}
    for device_id in ids:
        kind = DEVICES[device_id][0]
        owner = draw(st.none() | st.integers(0, 2))
        if kind != "cpu" and owner is not None:
            owners.setdefault((owner, kind), []).append(device_id)
    for (owner, kind), own in sorted(owners.items()):
        allocations.append(
            MeteredAllocation(
                work_id=f"w{owner}{kind}", member_index=0, tenant_id="t", node_id="n1",
                accelerator_kind=kind, accelerators=len(own), accelerator_ids=tuple(own),
                work_kind="training", started_at_s=draw(held_from),
                ended_at_s=draw(st.none() | st.floats(T0 + 1.0, T0 + 20.0)),
            )
        )  # fmt: skip
    for number in range(draw(st.integers(0, 3))):
        allocations.append(
            MeteredAllocation(
                work_id=f"c{number}", member_index=0, tenant_id="t", node_id="n1",
                accelerator_kind="cpu", accelerators=draw(st.integers(1, 60)),
                accelerator_ids=(), work_kind="training", started_at_s=draw(held_from),
                ended_at_s=draw(st.none() | st.floats(T0 + 1.0, T0 + 20.0)),
            )
        )  # fmt: skip
    return inventory, telemetry, mark, allocations


@settings(max_examples=300, deadline=None)
@given(node=shared_nodes())
def test_no_more_is_billed_than_the_node_measured(node: SharedNode) -> None:
    inventory, telemetry, mark, allocations = node
    increments, _ = meter(inventory, telemetry, mark, allocations)
    measured_j = sum(s.energy_j or 0.0 for s in telemetry.accelerators)
    assert sum(i.energy_j for i in increments) <= measured_j * (1 + 1e-12) + 1e-9


ALLOCATION = MeteredAllocation(
    work_id="w", member_index=1, tenant_id="t", node_id="n1", accelerator_kind="gpu",
    accelerators=1, accelerator_ids=("gpu0",), work_kind="training", started_at_s=0.0,
)  # fmt: skip


# Found by Hypothesis, kept so they are always checked.
# A step starting 1.2e-7 s after T0 (the float T0 + 2.4e-7 s) ends that long into the
# next hour: a real part of an hour, not rounding. The model once dropped parts shorter
# than 1e-6 s and expected no piece (first), no energy (second) or a later start (third).
@example(spans=[(1.192092896e-07, 3600.0, 0.0)], offset_s=0.0)
@example(spans=[(0.0, 3601.0, 0.0), (1.192092896e-07, 3600.0, 15100.0)], offset_s=0.0)
@example(spans=[(7201.0, 1.0, 0.0), (1.192092896e-07, 7200.0, 0.0)], offset_s=0.0)
# A grid clock 27 years behind keeps finer floats than ours: `hour - offset_s`, rounded to
# ours, read a hair before the grid's hour, and the code billed the 3088 s after it to the
# hour before (one piece across two hours of prices).
@example(spans=[(3366.622868, 6779.767751932144, 1e6)], offset_s=-865212966.6228682)
@settings(max_examples=300, deadline=None)
@given(
    spans=st.lists(
        st.tuples(
            st.floats(0.0, 3 * HOUR_S),
            st.just(0.0) | st.floats(1e-6, 2 * HOUR_S),
            st.floats(0.0, 1e6),
        ),
        min_size=1,
        max_size=6,
    ),
    offset_s=st.sampled_from([0.0, 1800.0, 900.0, -7 * HOUR_S - 600.0, 123.0])
    | st.floats(-2 * 365 * 24 * HOUR_S, 2 * 365 * 24 * HOUR_S)
    # A grid clock decades away, whose floats are finer or coarser than ours.
    | st.floats(-1.6e9, 1.6e9),
)
def test_accumulate_splits_at_both_clocks_hours(
    spans: list[tuple[float, float, float]], offset_s: float
) -> None:
    pieces: Pieces = {}
    expected: dict[tuple[int, int], list[float]] = {}  # (our hour, the grid's hour) -> sums
    for start, length, joules in spans:
        start += T0
        increment = Increment(
            allocation=ALLOCATION, start_s=start, end_s=start + length, energy_j=joules,
            measured_j=joules / 2, gap_s=length / 4,
        )  # fmt: skip
        accumulate(pieces, Priced(increment, "DE"), offset_s)
        # Share by time wherever either clock's hour changes, every part however short:
        # instants are floats, and two of them apart are time the node used.
        span_s = increment.end_s - increment.start_s
        for a, b in _parts(increment.start_s, increment.end_s, offset_s):
            part = (b - a) / span_s
            sums = expected.setdefault(_hours(a, offset_s), [0.0, 0.0, 0.0, math.inf, -math.inf])
            sums[0] += increment.energy_j * part
            sums[1] += increment.measured_j * part
            sums[2] += increment.gap_s * part
            sums[3] = min(sums[3], a)
            sums[4] = max(sums[4], b)
    assert {(k[3], k[4]) for k in pieces} == set(expected)
    for key, piece in pieces.items():
        sums = expected[(key[3], key[4])]
        # The same instants and shares, summed in the same order: only rounding differs.
        assert (piece.energy_j, piece.measured_j, piece.gap_s) == pytest.approx(
            sums[:3], rel=1e-12, abs=1e-12
        )
        assert (piece.start_s, piece.end_s) == (sums[3], sums[4])
        assert piece.start_s < piece.end_s  # no piece (and no row) for no time
        # Priced at one hour of each clock: the piece's instants all read them.
        assert _hours(piece.start_s, offset_s) == (key[3], key[4])
        last_instant_s = math.nextafter(piece.end_s, -math.inf)
        assert _hours(last_instant_s, offset_s) == (key[3], key[4])


def _hours(instant_s: float, offset_s: float) -> tuple[int, int]:
    """The hours an instant reads: ours, and the grid's, whose clock reads `t + offset_s`
    (a float sum, as every reader of the grid computes it)."""
    return math.floor(instant_s / HOUR_S), math.floor((instant_s + offset_s) / HOUR_S)


def _parts(start: float, end: float, offset_s: float) -> list[tuple[float, float]]:
    """[start, end) cut into the longest runs of float instants that read the same hours,
    each cut found by bisection over the floats between (readings only grow with the
    instant), nothing like the arithmetic the code uses to find them."""
    parts: list[tuple[float, float]] = []
    part_start = start
    while part_start < end:
        hours = _hours(part_start, offset_s)
        if _hours(end, offset_s) == hours:
            parts.append((part_start, end))
            break
        # Positive floats order as their bits do: the first instant reading other hours.
        reads_same, reads_other = _bits(part_start), _bits(end)
        while reads_other - reads_same > 1:
            middle = (reads_same + reads_other) // 2
            if _hours(_float(middle), offset_s) == hours:
                reads_same = middle
            else:
                reads_other = middle
        part_end = _float(reads_other)
        parts.append((part_start, part_end))
        part_start = part_end
    return parts


def _bits(value: float) -> int:
    bits: int = struct.unpack("<q", struct.pack("<d", value))[0]
    return bits


def _float(bits: int) -> float:
    value: float = struct.unpack("<d", struct.pack("<q", bits))[0]
    return value
