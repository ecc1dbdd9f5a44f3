"""Fixtures of the store tests; `database` (both backends) comes from tests/conftest.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cloud.store import Store, TenantRecord, open_store
from shared import secret_hashes
from tests.store.builders import make_tenant
from tests.store.databases import DatabaseUnderTest


@pytest.fixture(autouse=True)
def cheap_token_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """scrypt at 2**10 instead of 2**14: tokens are made in most tests, and the cost
    parameters travel with each hash, so verification is unchanged."""
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)


@pytest.fixture
async def store(database: DatabaseUnderTest) -> AsyncIterator[Store]:
    opened = await open_store(database.settings)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def tenant(store: Store) -> TenantRecord:
    return (await make_tenant(store, "acme")).tenant
