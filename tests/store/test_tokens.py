"""A tenant's bearer tokens (several each, rotated with an overlap, revoked), tenant
changes, the queue cap, and the audit log, on both backends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import msgspec
import pytest
from sqlalchemy import text

from cloud.store import (
    KEEP,
    Actor,
    AuditQuery,
    Authenticated,
    LastAdminTokenError,
    NewAudit,
    NewTenant,
    QueueFullError,
    Store,
    TenantChanges,
    TokenNotActiveError,
    TokenRefused,
    create_store_engine,
    open_store,
    resolve_database,
)
from cloud.store.migrate import migrate
from cloud.store.migrations import MIGRATIONS
from cloud.store.tenant_tokens import (
    FREE_SCRYPTS_PER_WINDOW,
    MAX_TURN_WAIT_S,
    SCRYPT_WINDOW_S,
    THROTTLED_SCRYPT_INTERVAL_S,
    ScryptBudget,
    TokenThrottled,
)
from cloud.store.tokens import issue_token, parse_token
from shared.secret_hashes import verify_secret
from tests.store.builders import make_tenant, submit
from tests.store.databases import DatabaseUnderTest
from tests.store.lock_waits import gate


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def timed_store(database: DatabaseUnderTest, clock: Clock) -> AsyncIterator[Store]:
    opened = await open_store(database.settings, clock=clock)
    try:
        yield opened
    finally:
        await opened.close()


async def test_a_rotated_token_works_until_its_overlap_ends_then_is_refused_as_rotated(
    timed_store: Store, clock: Clock, database: DatabaseUnderTest
) -> None:
    store = timed_store
    acme = await make_tenant(store, "acme")
    (first,) = await store.list_tokens(acme.tenant.tenant_id)
    assert (first.name, first.state(clock.now)) == ("initial", "active")
    assert await store.authenticate(acme.token) == acme.tenant  # cached from here on

    clock.now += 10
    rotated = await store.rotate_token(first.token_id, overlap_s=3600)
    assert rotated.old.replaced_by == rotated.new.record.token_id
    assert rotated.old.expires_at == clock.now + 3600
    assert rotated.new.record.name == "initial"
    # During the overlap both work, here and in another process (no cache there).
    other = await open_store(database.settings, clock=clock)
    try:
        for checker in (store, other):
            assert await checker.authenticate(acme.token) == acme.tenant
            assert await checker.authenticate(rotated.new.token) == acme.tenant
        clock.now += 3600
        for checker in (store, other):  # cached or read afresh: the overlap is over
            refused = await checker.check_token(acme.token)
            assert isinstance(refused, TokenRefused)
            assert refused.token.state(clock.now) == "expired"
            assert refused.token.replaced_by == rotated.new.record.token_id
            assert await checker.authenticate(rotated.new.token) == acme.tenant
    finally:
        await other.close()
    with pytest.raises(TokenNotActiveError, match="expired"):
        await store.rotate_token(first.token_id, overlap_s=0)
    states = {t.token_id: t.state(clock.now) for t in await store.list_tokens(None)}
    assert states == {first.token_id: "expired", rotated.new.record.token_id: "active"}


async def test_a_revoked_token_is_refused_at_once_and_says_so(
    timed_store: Store, clock: Clock, database: DatabaseUnderTest
) -> None:
    store = timed_store
    acme = await make_tenant(store, "acme")
    ci = await store.create_token(acme.tenant.tenant_id, "ci", created_by="acme")
    assert ci.record.created_by == "acme"
    assert ci.token not in str(await store.list_tokens(acme.tenant.tenant_id))
    checked = await store.check_token(ci.token)
    assert isinstance(checked, Authenticated)
    assert checked.tenant == acme.tenant
    assert checked.token.last_used_at == clock.now  # recorded when verified afresh
    listed = {t.name: t for t in await store.list_tokens(acme.tenant.tenant_id)}
    assert listed["ci"].last_used_at == clock.now
    assert listed["initial"].last_used_at is None

    clock.now += 5
    revoked = await store.revoke_token(ci.record.token_id)
    assert revoked.revoked_at == clock.now
    refused = await store.check_token(ci.token)  # it was cached as accepted
    assert isinstance(refused, TokenRefused)
    assert refused.token.state(clock.now) == "revoked"
    assert await store.authenticate(acme.token) == acme.tenant  # the tenant's other token
    other = await open_store(database.settings, clock=clock)
    try:
        assert isinstance(await other.check_token(ci.token), TokenRefused)
        # A wrong secret with a revoked token's id is just unknown: nothing is told.
        token_id = ci.record.token_id
        assert await other.check_token(f"gf_{token_id}_{'A' * 43}") is None
    finally:
        await other.close()
    again = await store.revoke_token(ci.record.token_id)
    assert again.revoked_at == revoked.revoked_at  # revoking twice keeps the first time


async def test_clients_arriving_together_with_an_uncached_token_share_one_verification(
    database: DatabaseUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant's many clients meet a cold cache together (a restart, the entry's
    expiry): one scrypt answers them all, and a wrong secret among them is still refused."""
    calls: list[str] = []

    def counted(secret: str, secret_hash: str) -> bool:
        calls.append(secret)
        return verify_secret(secret, secret_hash)

    monkeypatch.setattr("cloud.store.store.verify_secret", counted)
    writer = await open_store(database.settings)
    try:
        acme = await make_tenant(writer, "acme")
    finally:
        await writer.close()
    store = await open_store(database.settings)  # a cold cache
    try:
        forged = acme.token[:-4] + ("AAAA" if not acme.token.endswith("AAAA") else "BBBB")
        checks = await asyncio.gather(
            *(store.authenticate(acme.token) for _ in range(32)), store.authenticate(forged)
        )
        assert checks[:32] == [acme.tenant] * 32
        assert checks[32] is None
        assert len(calls) == 2  # one for the 32 alike, one for the forgery
    finally:
        await store.close()


async def test_the_admin_keeps_at_least_one_working_token(timed_store: Store) -> None:
    store = timed_store
    admin = await store.bootstrap_admin()
    assert admin is not None
    (only,) = await store.list_tokens(admin.tenant.tenant_id)
    with pytest.raises(LastAdminTokenError):
        await store.revoke_token(only.token_id)
    spare = await store.create_token(admin.tenant.tenant_id, "spare")
    await store.revoke_token(only.token_id)
    assert await store.authenticate(admin.token) is None
    assert await store.authenticate(spare.token) == admin.tenant
    # A tenant that is not an admin may revoke its last token: the admin makes another.
    acme = await make_tenant(store, "acme")
    (acme_token,) = await store.list_tokens(acme.tenant.tenant_id)
    await store.revoke_token(acme_token.token_id)


async def test_a_rotated_token_is_no_spare_for_the_admins_last_lasting_one(
    timed_store: Store, clock: Clock
) -> None:
    """A rotated token works only until its overlap ends: were the admin to revoke its
    replacement meanwhile, it would be locked out then."""
    store = timed_store
    admin = await store.bootstrap_admin()
    assert admin is not None
    (first,) = await store.list_tokens(admin.tenant.tenant_id)
    second = await store.rotate_token(first.token_id, overlap_s=3600)
    with pytest.raises(LastAdminTokenError):
        await store.revoke_token(second.new.record.token_id)
    third = await store.rotate_token(second.new.record.token_id, overlap_s=3600)
    with pytest.raises(LastAdminTokenError):  # two in their overlap: still no spare
        await store.revoke_token(third.new.record.token_id)
    # The rotated ones may go early: the newest keeps working after every overlap.
    await store.revoke_token(first.token_id)
    await store.revoke_token(second.new.record.token_id)
    clock.now += 3600
    assert await store.authenticate(third.new.token) == admin.tenant


async def test_guesses_at_a_token_id_cannot_lock_its_owner_out_of_a_fresh_replica(
    database: DatabaseUnderTest,
) -> None:
    """Token ids are not secret. A replica that has not verified a token's secret yet
    (restarted, or another one) and has had guesses at its id still accepts the secret."""
    writer = await open_store(database.settings)
    try:
        acme = await make_tenant(writer, "acme")
    finally:
        await writer.close()
    parsed = parse_token(acme.token)
    assert parsed is not None
    token_id, secret = parsed
    replica = await open_store(database.settings)
    try:
        for guess in range(FREE_SCRYPTS_PER_WINDOW):
            wrong = f"{guess:0{len(secret)}d}"
            assert await replica.check_token(f"gf_{token_id}_{wrong}") is None
        assert await replica.authenticate(acme.token) == acme.tenant
    finally:
        await replica.close()


def test_past_its_free_scrypts_a_token_id_gets_a_turn_at_a_time() -> None:
    clock = Clock()
    budget = ScryptBudget(clock)
    assert [budget.claim("a") for _ in range(FREE_SCRYPTS_PER_WINDOW)] == [0.0] * 10
    assert budget.claim("a") == 0.0  # the first turn, at once
    assert budget.claim("a") == THROTTLED_SCRYPT_INTERVAL_S  # waits for the next one
    throttled = budget.claim("a")  # nothing free soon enough: ask again, unchecked
    assert isinstance(throttled, TokenThrottled)
    assert throttled.retry_after_s == 2 * THROTTLED_SCRYPT_INTERVAL_S - MAX_TURN_WAIT_S
    assert budget.claim("b") == 0.0  # another id has its own budget
    clock.now += throttled.retry_after_s
    assert budget.claim("a") == MAX_TURN_WAIT_S  # as told: a turn, within the wait
    clock.now += SCRYPT_WINDOW_S
    assert budget.claim("a") == 0.0  # a new window, free ones again


async def test_two_revocations_at_once_leave_the_admin_a_working_token(
    database: DatabaseUnderTest,
) -> None:
    """Two replicas each revoke one of the admin's two tokens at the same moment: one
    revocation is refused as the last working token's, whichever comes second."""
    first, second = [await open_store(database.settings) for _ in range(2)]
    try:
        admin = await make_tenant(first, "root", admin=True)
        tenant_id = admin.tenant.tenant_id
        await first.create_token(tenant_id, "second")
        ids = [token.token_id for token in await first.list_tokens(tenant_id)]

        async def both_revoked() -> tuple[object, ...]:
            return await asyncio.gather(
                first.revoke_token(ids[0]), second.revoke_token(ids[1]), return_exceptions=True
            )

        async with asyncio.timeout(20), asyncio.TaskGroup() as tasks:
            if database.kind == "postgresql":
                # Both queue behind the gate's lock on the tokens, then go at once.
                tokens = "SELECT id FROM tenant_tokens WHERE tenant_id = :tenant FOR UPDATE"
                async with gate(database, tokens, {"tenant": tenant_id}) as until_waiting:
                    revocations = tasks.create_task(both_revoked())
                    await until_waiting(2)
            else:
                revocations = tasks.create_task(both_revoked())
        assert sorted(type(result).__name__ for result in revocations.result()) == [
            "LastAdminTokenError",
            "TokenRecord",
        ]
        now = time.time()
        assert [t.works(now) for t in await first.list_tokens(tenant_id)].count(True) == 1
    finally:
        await first.close()
        await second.close()


async def test_changes_to_a_tenant_apply_at_once_and_keep_what_is_not_named(
    timed_store: Store,
) -> None:
    store = timed_store
    created = await store.create_tenant(
        NewTenant(name="acme", quotas={"gpu": 8}, cohort="lab", max_queued=10)
    )
    assert await store.authenticate(created.token) == created.tenant  # cached
    assert not created.tenant.unlimited
    changed = await store.update_tenant(
        created.tenant.tenant_id,
        TenantChanges(quotas={"gpu": 2}, cohort=None, max_running=3, max_queued=KEEP),
    )
    assert (dict(changed.quotas), changed.cohort, changed.max_running, changed.max_queued) == (
        {"gpu": 2},
        None,
        3,
        10,
    )
    assert changed.allowed_priorities == created.tenant.allowed_priorities
    assert await store.authenticate(created.token) == changed  # the cache forgot the old
    assert await store.get_tenant(created.tenant.tenant_id) == changed
    with pytest.raises(ValueError, match="max_running must not be negative"):
        await store.update_tenant(created.tenant.tenant_id, TenantChanges(max_running=-1))
    free = await store.update_tenant(
        created.tenant.tenant_id,
        TenantChanges(quotas={}, max_running=None, max_queued=None),
    )
    assert free.unlimited


async def test_a_submission_beyond_max_queued_is_refused_and_a_retry_still_answered(
    timed_store: Store,
) -> None:
    store = timed_store
    created = await store.create_tenant(NewTenant(name="acme", max_queued=2))
    tenant_id = created.tenant.tenant_id
    first = await submit(store, tenant_id, key="one")
    await submit(store, tenant_id)
    with pytest.raises(QueueFullError) as refused:
        await submit(store, tenant_id)
    assert (refused.value.max_queued, refused.value.queued) == (2, 2)
    retry = await submit(store, tenant_id, key="one")
    assert (retry.created, retry.work.work_id) == (False, first.work.work_id)
    await store.cancel_work(tenant_id, first.work.work_id)
    assert (await submit(store, tenant_id)).created  # room again
    # Another tenant's queue is its own.
    other = await make_tenant(store, "globex")
    assert (await submit(store, other.tenant.tenant_id)).created


async def test_audit_entries_commit_with_their_action_and_read_newest_first(
    timed_store: Store, clock: Clock
) -> None:
    store = timed_store
    admin = await store.bootstrap_admin()
    assert admin is not None
    actor = Actor(admin.tenant.tenant_id, "admin")
    acme = await store.create_tenant(
        NewTenant(name="acme"), audit=NewAudit(actor=actor, action="tenant.create", target="acme")
    )
    clock.now += 60
    token = await store.create_token(
        acme.tenant.tenant_id, "ci", audit=NewAudit(actor=actor, action="token.create", target="")
    )
    job = await submit(store, acme.tenant.tenant_id)
    cancel = NewAudit(
        actor=actor,
        action="work.cancel",
        target=job.work.work_id,
        detail=msgspec.json.encode({"tenant": "acme"}),
    )
    result = await store.cancel_work(
        acme.tenant.tenant_id, job.work.work_id, actor="admin", audit=cancel
    )
    assert result.work[0].state == "cancelled"
    # A failed action leaves no entry: cancelling it again is refused, nothing recorded.
    with pytest.raises(Exception, match="not a legal transition"):
        await store.cancel_work(acme.tenant.tenant_id, job.work.work_id, audit=cancel)

    page = await store.list_audit(AuditQuery())
    assert [(e.action, e.target) for e in page.items] == [
        ("work.cancel", job.work.work_id),
        ("token.create", token.record.token_id),  # the empty target became the new id
        ("tenant.create", "acme"),
    ]
    assert page.next_cursor is None
    assert msgspec.json.decode(page.items[0].detail) == {"tenant": "acme"}
    assert {e.actor for e in page.items} == {"admin"}
    first = await store.list_audit(AuditQuery(limit=2))
    assert len(first.items) == 2
    assert first.next_cursor == first.items[-1].seq
    rest = await store.list_audit(AuditQuery(limit=2, cursor=first.next_cursor))
    assert [e.action for e in rest.items] == ["tenant.create"]
    recent = await store.list_audit(AuditQuery(since=clock.now - 1))
    assert [e.action for e in recent.items] == ["work.cancel", "token.create"]
    picked = await store.list_audit(AuditQuery(actions=("tenant.create", "work.cancel")))
    assert [e.action for e in picked.items] == ["work.cancel", "tenant.create"]
    assert (await store.list_audit(AuditQuery(actor="acme"))).items == ()
    # The cancellation's event names who asked.
    events = await store.list_events(tenant_id=acme.tenant.tenant_id)
    assert msgspec.json.decode(events[-1].payload)["actor"] == "admin"


async def test_migrating_moves_every_tenants_token_into_the_token_table(
    database: DatabaseUnderTest,
) -> None:
    """A database from before v0010: its tenants' tokens keep working after it."""
    engine = create_store_engine(database.settings)
    target = resolve_database(database.settings)
    issued = issue_token()
    try:
        await migrate(engine, target, migrations=MIGRATIONS[:9])
        async with engine.begin() as connection:
            await connection.execute(
                text(
                    "INSERT INTO tenants (id, name, token_id, token_hash, quotas, "
                    "borrowing_limit, cohort, allowed_priorities, admin, created_at) VALUES "
                    "('01JE0000000000000000000000', 'old', :token_id, :hash, '{}', '{}', NULL, "
                    """'["p0","p1","p2"]', false, 1.0)"""
                ),
                {"token_id": issued.token_id, "hash": issued.secret_hash},
            )
    finally:
        await engine.dispose()
    store = await open_store(database.settings)
    try:
        tenant = await store.authenticate(issued.token)
        assert tenant is not None
        assert (tenant.name, tenant.max_running, tenant.max_queued) == ("old", None, None)
        assert tenant.unlimited
        (moved,) = await store.list_tokens(tenant.tenant_id)
        assert (moved.token_id, moved.name, moved.created_at) == (issued.token_id, "initial", 1.0)
    finally:
        await store.close()
