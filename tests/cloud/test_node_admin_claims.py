"""The node-admin refresh (cloud/fleet/node_admin.py) every 2 s without a walk over every
node when nothing changed: `FirstClaims` returns what a walk finds after every change a
registry goes through (births, wills, staleness, departures, admins' settings and
approvals, new envelopes), and walks only when the registry's version moved; the
refresh loop leaves the registry's settings alone while the store's are those it holds."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping

import msgspec
import pytest

from cloud.fleet import node_admin
from cloud.fleet.envelope import NodeClaim, NodeEnvelope, claim_of
from cloud.fleet.node_admin import FirstClaims, first_claims, refresh_forever
from cloud.fleet.registry import NodeRegistry
from cloud.store import NodeAdminRecord
from tests.cloud.test_accelerator_metrics import A100, NOW_S, XEON, birth

pytestmark = pytest.mark.timeout(60)

ZONES = ("DE", "FR")


class Fleet:
    """A registry and the enrolment it is judged by, changed at random."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.registry = NodeRegistry(monotonic=lambda: 100.0, wall_clock=lambda: NOW_S)
        self.envelopes: dict[str, NodeEnvelope] = {}
        self.registry.envelope_of = self.envelopes.get
        self.admin: dict[str, NodeAdminRecord] = {}
        self.births = 0

    def node_id(self) -> str:
        return f"node-{self.rng.randrange(12)}"

    def step(self) -> None:
        rng, registry, node_id = self.rng, self.registry, self.node_id()
        record = registry.get(node_id)
        action = rng.randrange(8)
        if action == 0 or record is None:  # a birth, a rebirth somewhere else, a new instance
            self.births += 1
            instance = record.status.instance_id if record and rng.random() < 0.5 else None
            status = birth(node_id, (XEON, A100), site="cloud", zone=rng.choice(ZONES))
            status = msgspec.structs.replace(
                status, instance_id=instance or f"{node_id}-i{self.births}"
            )
            registry.apply_status(status)
        elif action == 1:  # a will
            registry.apply_status(
                msgspec.structs.replace(record.status, state="offline", offline_reason="shutdown")
            )
        elif action == 2:
            registry.mark_offline([node_id], "telemetry-stale")
        elif action == 3:
            registry.forget(node_id)
        elif action == 4:  # enrolled (again), or enrolled with another envelope
            self.envelopes[node_id] = NodeEnvelope(zone=rng.choice((None, *ZONES)))
            registry.judge_again([node_id])
        elif action == 5:  # an admin approves what it is, or another zone
            claim = claim_of(record.status)
            approved = msgspec.structs.replace(claim, zone=rng.choice(ZONES), by_admin=True)
            self.admin[node_id] = NodeAdminRecord(node_id, approved=approved)
            registry.set_admin(self.admin)
        elif action == 6:  # a cordon, or the settings cleared
            if rng.random() < 0.5:
                self.admin[node_id] = NodeAdminRecord(node_id, cordoned=True)
            else:
                self.admin.pop(node_id, None)
            registry.set_admin(self.admin)
        else:  # its first claim recorded, as the refresh does
            self.admin[node_id] = NodeAdminRecord(node_id, approved=claim_of(record.status))
            registry.set_admin(self.admin)


@pytest.mark.parametrize("seed", range(6))
def test_first_claims_are_what_a_walk_finds_after_every_change(seed: int) -> None:
    fleet = Fleet(seed)
    claims = FirstClaims(fleet.registry)
    seen_claims = 0
    for _ in range(400):
        fleet.step()
        expected = first_claims(fleet.registry)
        assert claims.claims() == expected
        seen_claims += len(expected)
        walks = claims.walks
        assert claims.claims() == expected
        assert claims.walks == walks  # nothing moved: no walk
    assert seen_claims > 50  # the fleet had claims to find


def test_a_new_envelope_that_changes_no_verdict_is_claimed() -> None:
    fleet = Fleet(0)
    registry = fleet.registry
    registry.apply_status(birth("node-1", (A100,), site="cloud", zone="DE"))
    claims = FirstClaims(registry)
    assert claims.claims() == {}  # not enrolled with an envelope: nothing to claim
    fleet.envelopes["node-1"] = NodeEnvelope()
    assert registry.judge_again(["node-1"]) is False  # it waits for nothing, before or after
    record = registry.get("node-1")
    assert record is not None
    assert claims.claims() == {"node-1": claim_of(record.status)}


class Store:
    """The store's side of the refresh: the same settings every round."""

    def __init__(self, admin: Mapping[str, NodeAdminRecord], rounds: int) -> None:
        self.admin = admin
        self.reads = 0
        self.rounds = rounds
        self.done = asyncio.Event()
        self.claimed: list[Mapping[str, NodeClaim]] = []

    async def node_admin(self) -> dict[str, NodeAdminRecord]:
        self.reads += 1
        if self.reads >= self.rounds:
            self.done.set()
        return dict(self.admin)  # a new mapping each read, as the store's

    async def set_first_claims(self, claims: Mapping[str, NodeClaim]) -> None:
        self.claimed.append(claims)


def test_the_refresh_walks_the_nodes_and_sets_the_settings_only_after_a_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = NodeRegistry(monotonic=lambda: 100.0, wall_clock=lambda: NOW_S)
    for number in range(5):
        registry.apply_status(birth(f"node-{number}", (A100,), site="cloud", zone="DE"))
    store = Store({"node-0": NodeAdminRecord("node-0", cordoned=True)}, rounds=20)
    walks: list[int] = []
    settings: list[int] = []
    walk, set_admin = node_admin.first_claims, registry.set_admin

    def counted_walk(walked: NodeRegistry) -> dict[str, NodeClaim]:
        walks.append(walked.version)
        return walk(walked)

    def counted_set_admin(admin: Mapping[str, NodeAdminRecord]) -> bool:
        settings.append(len(admin))
        return set_admin(admin)

    monkeypatch.setattr(node_admin, "first_claims", counted_walk)
    registry.set_admin = counted_set_admin  # type: ignore[method-assign]

    async def refresh() -> None:
        task = asyncio.create_task(refresh_forever(registry, store, interval_s=0))  # type: ignore[arg-type]
        try:
            await asyncio.wait_for(store.done.wait(), 10)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(refresh())
    assert store.reads >= 20
    assert len(walks) == 1  # the first round's; the version never moved since
    assert len(settings) == 1  # the first round's; the store said the same since
    assert store.claimed == []  # not enrolled: nothing claimed
    record = registry.get("node-0")
    assert record is not None
    assert record.admin == store.admin["node-0"]
