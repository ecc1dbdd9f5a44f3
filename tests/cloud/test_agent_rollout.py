"""How an agent rollout moves through the fleet (cloud/upgrades/rollout.py): waves that
start small and double, nodes decided by their births, a wave whose failures pass the
share halting everything after it."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from cloud.fleet.registry import NodeRecord
from cloud.upgrades.rollout import advance, asked_nodes, new_rollout, wave_sizes, waves_of
from cloud.upgrades.views import RolloutPhase, RolloutRequest, RolloutState
from shared.messages import AgentUpgradeReport
from tests.loop.builders import node

ROLLOUT = "r1"
NEW = "2.0"


def fleet(count: int, *, version: str = "1.0", self_upgrade: bool = True) -> dict[str, NodeRecord]:
    records = {}
    for index in range(count):
        record = node(f"n{index:03d}")
        status = msgspec.structs.replace(
            record.status, agent_version=version, self_upgrade=self_upgrade
        )
        records[record.node_id] = dataclasses.replace(record, status=status)
    return records


def running(records: dict[str, NodeRecord], node_id: str, version: str) -> None:
    record = records[node_id]
    records[node_id] = dataclasses.replace(
        record, status=msgspec.structs.replace(record.status, agent_version=version)
    )


def rolled_back(records: dict[str, NodeRecord], node_id: str, rollout_id: str = ROLLOUT) -> None:
    record = records[node_id]
    report = AgentUpgradeReport(
        version=NEW, rollout_id=rollout_id, outcome="rolled-back", detail="exited 1", at=5.0
    )
    records[node_id] = dataclasses.replace(
        record, status=msgspec.structs.replace(record.status, agent_upgrade=report)
    )


def upgrading(state: RolloutState) -> list[str]:
    return sorted(n for n, entry in state.nodes.items() if entry.state == "upgrading")


@pytest.mark.parametrize(
    ("nodes", "canary", "sizes"),
    [
        (1, 10, [1]),
        (10, 10, [1, 2, 4, 3]),
        (100, 10, [10, 20, 40, 30]),
        (3, 34, [2, 1]),
        (5, 100, [5]),
        (0, 10, []),
    ],
)
def test_waves_start_with_the_canaries_and_double(
    nodes: int, canary: float, sizes: list[int]
) -> None:
    assert wave_sizes(nodes, canary) == sizes
    assert sum(sizes) == nodes


def test_a_good_version_reaches_every_node_wave_by_wave() -> None:
    records = fleet(10)
    state = new_rollout(ROLLOUT, RolloutRequest(version=NEW), records, records, now=0.0)
    assert [w.nodes for w in waves_of(state)] == [1, 2, 4, 3]
    phase: RolloutPhase = "running"
    seen_waves = []
    now = 0.0
    while phase == "running":
        asked = upgrading(state)
        assert asked_nodes(phase, state) >= set(asked)
        seen_waves.append(len(asked))
        for node_id in asked:
            running(records, node_id, NEW)
        now += 1
        phase, state = advance(ROLLOUT, NEW, phase, state, records, now)
    assert phase == "succeeded"
    assert seen_waves == [1, 2, 4, 3]
    assert {entry.state for entry in state.nodes.values()} == {"upgraded"}
    assert state.finished_at == now


def test_a_canary_that_rolls_back_halts_the_rollout_and_spares_the_rest() -> None:
    records = fleet(20)
    rules = RolloutRequest(version=NEW, canary_percent=10, max_failure_share=0.2)
    state = new_rollout(ROLLOUT, rules, records, records, now=0.0)
    canaries = upgrading(state)
    assert len(canaries) == 2
    running(records, canaries[0], NEW)
    rolled_back(records, canaries[1])
    phase, state = advance(ROLLOUT, NEW, "running", state, records, 1.0)
    assert phase == "halted"
    assert state.detail == "wave 1: 1 of 2 nodes failed"
    assert state.nodes[canaries[1]].state == "failed"
    assert "rolled-back: exited 1" in state.nodes[canaries[1]].detail
    # The failed node is asked no more; the one that upgraded keeps it; nobody else is asked.
    assert asked_nodes(phase, state) == {canaries[0]}
    assert sum(entry.state == "waiting" for entry in state.nodes.values()) == 18


def test_a_halted_rollout_still_records_the_nodes_it_had_asked() -> None:
    records = fleet(3)
    rules = RolloutRequest(version=NEW, canary_percent=100, max_failure_share=0.5)
    state = new_rollout(ROLLOUT, rules, records, records, now=0.0)
    first, second, third = upgrading(state)
    rolled_back(records, first)
    rolled_back(records, second)
    phase, state = advance(ROLLOUT, NEW, "running", state, records, 1.0)
    assert (phase, state.detail) == ("halted", "wave 1: 2 of 3 nodes failed")
    assert asked_nodes(phase, state) == {third}  # on its way: not asked to turn back
    running(records, third, NEW)
    phase, state = advance(ROLLOUT, NEW, phase, state, records, 2.0)
    assert phase == "halted"
    assert state.nodes[third].state == "upgraded"


def test_a_failure_of_another_rollout_does_not_count() -> None:
    records = fleet(1)
    state = new_rollout(ROLLOUT, RolloutRequest(version=NEW), records, records, now=0.0)
    rolled_back(records, "n000", rollout_id="an-older-one")
    phase, state = advance(ROLLOUT, NEW, "running", state, records, 1.0)
    assert (phase, state.nodes["n000"].state) == ("running", "upgrading")


def test_a_node_that_never_answers_fails_at_the_waves_bound() -> None:
    records = fleet(1)
    rules = RolloutRequest(version=NEW, wave_timeout_s=60)
    state = new_rollout(ROLLOUT, rules, records, records, now=0.0)
    phase, state = advance(ROLLOUT, NEW, "running", state, records, 59.0)
    assert phase == "running"
    phase, state = advance(ROLLOUT, NEW, phase, state, records, 61.0)
    assert phase == "halted"
    assert "no answer within the wave's 60 s" in state.nodes["n000"].detail


def test_nodes_that_cannot_upgrade_are_skipped_and_those_on_the_version_count_as_done() -> None:
    records = (
        fleet(2)
        | {f"old-{k}": v for k, v in fleet(2, self_upgrade=False).items()}
        | {f"done-{k}": v for k, v in fleet(1, version=NEW).items()}
    )
    state = new_rollout(ROLLOUT, RolloutRequest(version=NEW), records, records, now=0.0)
    states = {node_id: entry.state for node_id, entry in state.nodes.items()}
    assert states["old-n000"] == states["old-n001"] == "skipped"
    assert "cannot upgrade itself" in state.nodes["old-n000"].detail
    assert states["done-n000"] == "upgraded"
    assert sorted(n for n, s in states.items() if s in ("upgrading", "waiting")) == ["n000", "n001"]
    assert "old-n000" not in asked_nodes("running", state)


def test_nodes_on_the_version_already_do_not_dilute_the_canaries_failures() -> None:
    """Half the fleet runs the version already (an earlier rollout was cancelled): the
    canaries are a share of the others, and a canary that rolls back halts the rollout
    as it would in a fleet without those nodes."""
    records = fleet(10) | {f"done-{k}": v for k, v in fleet(10, version=NEW).items()}
    rules = RolloutRequest(version=NEW, canary_percent=10, max_failure_share=0.2)
    state = new_rollout(ROLLOUT, rules, records, records, now=0.0)
    (canary,) = upgrading(state)
    assert [wave.nodes for wave in waves_of(state)] == [1, 2, 4, 3]
    rolled_back(records, canary)
    phase, state = advance(ROLLOUT, NEW, "running", state, records, 1.0)
    assert (phase, state.detail) == ("halted", "wave 1: 1 of 1 nodes failed")
    assert upgrading(state) == []
    done = {node_id for node_id in records if node_id.startswith("done-")}
    assert {state.nodes[node_id].state for node_id in done} == {"upgraded"}
    assert asked_nodes(phase, state) == done  # they keep the version they run


def test_a_cancelled_rollout_asks_nobody() -> None:
    records = fleet(3)
    state = new_rollout(
        ROLLOUT, RolloutRequest(version=NEW, canary_percent=100), records, records, 0.0
    )
    assert len(asked_nodes("running", state)) == 3
    assert asked_nodes("cancelled", state) == frozenset()


def test_the_canaries_are_a_sample_not_the_first_names() -> None:
    records = fleet(100)
    first = new_rollout("r-a", RolloutRequest(version=NEW), records, records, 0.0)
    second = new_rollout("r-b", RolloutRequest(version=NEW), records, records, 0.0)
    assert upgrading(first) != [f"n{i:03d}" for i in range(10)]
    assert upgrading(first) != upgrading(second)
