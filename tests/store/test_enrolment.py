"""Join tokens and enrolled nodes in the store, on SQLite and PostgreSQL: hashed at rest,
expiring, counted atomically under concurrency, revocable."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select

from cloud.store import Store, open_store
from cloud.store.enrolment import NewJoinToken, NodeDefaults, token_sha256
from cloud.store.errors import (
    JoinTokenExpiredError,
    JoinTokenRevokedError,
    JoinTokenUnknownError,
    JoinTokenUsedUpError,
    NodeAlreadyEnrolledError,
)
from cloud.store.schema import join_tokens
from tests.store.databases import DatabaseUnderTest


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_a_token_is_stored_only_as_its_hash(store: Store) -> None:
    created = await store.create_join_token(
        NewJoinToken(ttl_s=60, max_uses=2, defaults=NodeDefaults(zone="DE", labels={"a": "b"}))
    )
    assert created.token.startswith("gfj_")
    async with store._read() as connection:  # what an attacker with the database sees
        rows = (await connection.execute(select(join_tokens))).all()
    assert len(rows) == 1
    assert created.token not in repr(tuple(rows[0]))
    assert rows[0].token_sha256 == token_sha256(created.token)
    (listed,) = await store.list_join_tokens()
    assert listed == created.record
    assert listed.defaults == NodeDefaults(zone="DE", labels={"a": "b"})


async def test_redemption_enrols_the_node_and_counts_the_use(store: Store) -> None:
    created = await store.create_join_token(NewJoinToken(ttl_s=60))
    redemption = await store.redeem_join_token(created.token, "edge-1")
    assert redemption.token.uses == 1
    assert await store.is_enrolled("edge-1")
    assert not await store.is_enrolled("edge-2")
    with pytest.raises(JoinTokenUsedUpError):
        await store.redeem_join_token(created.token, "edge-2")
    with pytest.raises(JoinTokenUnknownError):
        await store.redeem_join_token("gfj_not-a-token", "edge-2")
    assert not await store.is_enrolled("edge-2")


async def test_an_expired_token_is_refused(database: DatabaseUnderTest) -> None:
    clock = Clock()
    async with await open_store(database.settings, clock=clock) as store:
        created = await store.create_join_token(NewJoinToken(ttl_s=60))
        clock.now += 60
        with pytest.raises(JoinTokenExpiredError):
            await store.redeem_join_token(created.token, "edge-1")
        (listed,) = await store.list_join_tokens()
        assert listed.state(clock.now) == "expired"
        assert listed.uses == 0


async def test_a_revoked_token_is_refused(store: Store) -> None:
    created = await store.create_join_token(NewJoinToken(ttl_s=60, max_uses=5))
    revoked = await store.revoke_join_token(created.record.token_id)
    assert revoked.revoked_at is not None
    assert (await store.revoke_join_token(created.record.token_id)) == revoked  # idempotent
    with pytest.raises(JoinTokenRevokedError):
        await store.redeem_join_token(created.token, "edge-1")
    with pytest.raises(JoinTokenUnknownError):
        await store.revoke_join_token("no-such-id")


@pytest.mark.parametrize("max_uses", [1, 3])
async def test_concurrent_redemptions_succeed_exactly_max_uses_times(
    database: DatabaseUnderTest, max_uses: int
) -> None:
    # Two stores (two connection pools, like two API replicas) race for the token.
    async with (
        await open_store(database.settings) as first,
        await open_store(database.settings) as second,
    ):
        created = await first.create_join_token(NewJoinToken(ttl_s=60, max_uses=max_uses))
        stores = (first, second)
        outcomes = await asyncio.gather(
            *(
                stores[index % 2].redeem_join_token(created.token, f"edge-{index}")
                for index in range(12)
            ),
            return_exceptions=True,
        )
        succeeded = [o for o in outcomes if not isinstance(o, BaseException)]
        refused = [o for o in outcomes if isinstance(o, BaseException)]
        assert len(succeeded) == max_uses
        assert all(isinstance(error, JoinTokenUsedUpError) for error in refused), refused
        (listed,) = await first.list_join_tokens()
        assert listed.uses == max_uses
        enrolled = [node for node in await first.list_enrolled_nodes() if node.active]
        assert len(enrolled) == max_uses


async def test_an_enrolled_id_cannot_be_taken_over_until_revoked(store: Store) -> None:
    created = await store.create_join_token(NewJoinToken(ttl_s=60, max_uses=3))
    await store.redeem_join_token(created.token, "edge-1")
    with pytest.raises(NodeAlreadyEnrolledError):
        await store.redeem_join_token(created.token, "edge-1")
    (token,) = await store.list_join_tokens()
    assert token.uses == 1  # the refused attempt did not use the token up
    revoked = await store.revoke_node("edge-1")
    assert revoked.revoked_at is not None
    assert not await store.is_enrolled("edge-1")
    again = await store.redeem_join_token(created.token, "edge-1")
    assert again.previous == revoked
    assert await store.is_enrolled("edge-1")


async def test_a_release_undoes_a_redemption(store: Store) -> None:
    created = await store.create_join_token(NewJoinToken(ttl_s=60))
    redemption = await store.redeem_join_token(created.token, "edge-1")
    await store.release_redemption(redemption)
    assert not await store.is_enrolled("edge-1")
    assert await store.list_enrolled_nodes() == ()
    (token,) = await store.list_join_tokens()
    assert token.uses == 0
    await store.redeem_join_token(created.token, "edge-1")  # usable again


async def test_revoking_a_node_that_never_enrolled_refuses_it_too(store: Store) -> None:
    revoked = await store.revoke_node("legacy-node")
    assert revoked.join_token_id is None
    assert revoked.revoked_at is not None
    assert (await store.revoke_node("legacy-node")).revoked_at == revoked.revoked_at
    assert not await store.is_enrolled("legacy-node")
    await store.set_enrolled_username("legacy-node", "legacy-node")
    (listed,) = await store.list_enrolled_nodes()
    assert listed.username == "legacy-node"


async def test_a_node_is_pinned_to_the_sealing_key_it_enrolled_with(store: Store) -> None:
    created = await store.create_join_token(NewJoinToken(ttl_s=60, max_uses=3))
    first_key, second_key = "A" * 43 + "=", "B" * 43 + "="
    redemption = await store.redeem_join_token(
        created.token, "edge-1", sealing_public_key=first_key
    )
    assert redemption.node.sealing_public_key == first_key
    assert await store.get_enrolled_node("edge-1") == redemption.node
    # A new key pair on the same enrolled node (greenfed up's simulated nodes each run).
    assert await store.pin_sealing_key("edge-1", second_key)
    enrolled = await store.get_enrolled_node("edge-1")
    assert enrolled is not None
    assert enrolled.sealing_public_key == second_key
    # Only an enrolled, unrevoked node is pinned.
    assert not await store.pin_sealing_key("edge-2", second_key)
    revoked = await store.revoke_node("edge-1")
    assert not await store.pin_sealing_key("edge-1", first_key)
    # Enrolling again pins what the node sends now; undoing that restores the old pin.
    again = await store.redeem_join_token(created.token, "edge-1")
    assert again.node.sealing_public_key is None
    await store.release_redemption(again)
    (listed,) = await store.list_enrolled_nodes()
    assert listed == revoked
    assert listed.sealing_public_key == second_key
