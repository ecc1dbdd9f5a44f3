"""Tenants: creation, listing, bearer tokens stored as salted hashes, authentication."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from cloud.store import (
    NewTenant,
    Store,
    TenantExistsError,
    TenantNotFoundError,
    TokenNotFoundError,
    tokens,
)
from cloud.store.schema import tenants
from cloud.store.tokens import parse_token
from shared.secret_hashes import verify_secret
from tests.store.builders import make_tenant


async def test_create_get_and_list_tenants(store: Store) -> None:
    created = await store.create_tenant(
        NewTenant(
            name="acme",
            quotas={"gpu": 8, "npu": 2},
            borrowing_limit={"gpu": 4},
            cohort="research",
            allowed_priorities=("p1", "p2"),
        )
    )
    other = await make_tenant(store, "globex", admin=True)
    record = created.tenant
    assert dict(record.quotas) == {"gpu": 8, "npu": 2}
    assert dict(record.borrowing_limit) == {"gpu": 4}
    assert (record.cohort, record.allowed_priorities, record.admin) == (
        "research",
        ("p1", "p2"),
        False,
    )
    assert await store.get_tenant(record.tenant_id) == record
    assert await store.get_tenant_by_name("globex") == other.tenant
    assert await store.list_tenants() == (record, other.tenant)
    assert await store.get_tenant("nobody") is None


async def test_tenant_names_are_unique(store: Store) -> None:
    await make_tenant(store, "acme")
    with pytest.raises(TenantExistsError, match="acme"):
        await make_tenant(store, "acme")
    assert len(await store.list_tenants()) == 1


@pytest.mark.parametrize(
    ("tenant", "message"),
    [
        (NewTenant(name="Has Spaces"), "must match"),
        (NewTenant(name="acme", quotas={"gpu": -1}), "must not be negative"),
        (NewTenant(name="acme", allowed_priorities=()), "at least one"),
    ],
)
async def test_invalid_tenants_are_refused(store: Store, tenant: NewTenant, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        await store.create_tenant(tenant)


async def test_only_a_salted_hash_of_the_token_is_stored(store: Store) -> None:
    created = await make_tenant(store, "acme")
    parsed = parse_token(created.token)
    assert parsed is not None
    token_id, secret = parsed
    async with store._read() as connection:
        row = (await connection.execute(select(tenants))).one()
    stored = " ".join(str(value) for value in row)
    assert secret not in stored
    assert row.token_id == token_id
    assert row.token_hash.startswith("scrypt$")
    assert verify_secret(secret, row.token_hash)
    # Salted: the same secret hashes differently for another tenant.
    second = await make_tenant(store, "globex")
    async with store._read() as connection:
        hashes = (await connection.execute(select(tenants.c.token_hash))).scalars().all()
    assert len(set(hashes)) == 2
    assert second.token != created.token


async def test_authenticate_finds_the_tenant_of_a_token(store: Store) -> None:
    acme = await make_tenant(store, "acme")
    globex = await make_tenant(store, "globex")
    assert await store.authenticate(acme.token) == acme.tenant
    assert await store.authenticate(globex.token) == globex.tenant
    assert await store.authenticate(acme.token) == acme.tenant  # cached now
    token_id, secret = acme.token.split("_")[1], acme.token.split("_", 2)[2]
    wrong_secret = f"gf_{token_id}_{'A' * len(secret)}"
    unknown_id = f"gf_{'0' * 16}_{secret}"
    for bad in (wrong_secret, unknown_id, "", "Bearer x", acme.token + "x", "gf_x_y"):
        assert await store.authenticate(bad) is None, bad


async def test_a_rotated_token_replaces_the_old_one(store: Store) -> None:
    acme = await make_tenant(store, "acme")
    assert await store.authenticate(acme.token) == acme.tenant
    (first,) = await store.list_tokens(acme.tenant.tenant_id)
    rotated = await store.rotate_token(first.token_id, overlap_s=0)
    assert await store.authenticate(acme.token) is None
    assert await store.authenticate(rotated.new.token) == acme.tenant
    with pytest.raises(TokenNotFoundError):
        await store.rotate_token("0" * 16, overlap_s=0)
    with pytest.raises(TenantNotFoundError):
        await store.create_token("nobody", "ci")


async def test_bootstrap_admin_creates_one_admin_once(store: Store) -> None:
    first = await store.bootstrap_admin()
    assert first is not None
    assert first.tenant.admin
    assert await store.bootstrap_admin() is None
    assert await store.authenticate(first.token) == first.tenant


def test_production_tokens_use_interactive_login_scrypt_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.undo()  # the cheap hashing of the other tests
    issued = tokens.issue_token()
    algorithm, log2_n, r, p, _, _ = issued.secret_hash.split("$")
    assert (algorithm, int(log2_n), int(r), int(p)) == ("scrypt", 14, 8, 1)
