"""Fixtures of the REST API tests; `database` (both backends) comes from tests/conftest.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shared import secret_hashes
from tests.api.support import Api, running_api
from tests.store.databases import DatabaseUnderTest


@pytest.fixture(autouse=True)
def cheap_token_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """scrypt at 2**10 instead of 2**14 (parameters travel with each hash)."""
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with running_api(database) as running:
        yield running
