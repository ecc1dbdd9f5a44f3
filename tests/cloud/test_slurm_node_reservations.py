"""Machines in a Slurm reservation take no new work from greenfed (its jobs never ask for
a reservation, so one placed there would wait in the cluster's queue): they are
unavailable, saying why, through `scontrol -o show node` and through slurmrestd alike
(cloud/clusters/slurm/records.py, cloud/clusters/slurm/rest_dialects.py)."""

from __future__ import annotations

import pytest

from cloud.clusters.slurm.records import nodes_of
from cloud.clusters.slurm.rest_dialects import V0038, dialect_of

MAINTENANCE = "in a maintenance reservation"
RESERVED = "in a reservation greenfed's jobs do not ask for"


def scontrol_node(state: str) -> str:
    line = (
        "NodeName=gfnode1 CPUTot=8 Gres=gpu:a100:4 RealMemory=8000 "
        f"State={state} Partitions=gpu AllocTRES=\n"
    )
    (node,) = nodes_of(line)
    return node.unavailable


@pytest.mark.parametrize(
    ("state", "why"),
    [
        # As Slurm 22.05 printed them with a maintenance reservation on gfnode1 and
        # another on gfnode2.
        ("IDLE+MAINTENANCE+RESERVED", f"idle+maintenance+reserved: {MAINTENANCE}"),
        ("IDLE+RESERVED", f"idle+reserved: {RESERVED}"),
        ("IDLE+MAINT+RESERVED", f"idle+maint+reserved: {MAINTENANCE}"),
        ("MAINT", f"maint: {MAINTENANCE}"),
        ("MIXED+RESERVED", f"mixed+reserved: {RESERVED}"),
    ],
)
def test_a_machine_in_a_reservation_takes_no_work_saying_why(state: str, why: str) -> None:
    assert scontrol_node(state) == why


def test_a_machine_outside_any_reservation_still_takes_work() -> None:
    assert scontrol_node("IDLE") == ""
    assert scontrol_node("MIXED") == ""


def test_slurmrestd_reports_reservations_the_same() -> None:
    raw = {"name": "gfnode1", "partitions": ["gpu"], "cpus": 8, "real_memory": 8000, "reason": ""}
    old = V0038("v0.0.38").node(
        {**raw, "state": "idle", "state_flags": ["MAINTENANCE", "RESERVED"]}
    )
    assert old is not None
    assert old.unavailable == f"idle+maintenance+reserved: {MAINTENANCE}"
    for version in ("v0.0.41", "v0.0.45"):
        node = dialect_of(version).node({**raw, "state": ["IDLE", "RESERVED"]})
        assert node is not None
        assert node.unavailable == f"idle+reserved: {RESERVED}"
