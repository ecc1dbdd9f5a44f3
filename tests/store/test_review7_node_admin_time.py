"""A node's admin settings are stamped with a time that strictly grows: the API keeps the
newest of concurrent answers in its registry by that time, and a tie (two changes whose
clocks were read in the other order than they committed) let the older one win."""

from __future__ import annotations

import pytest

from cloud.store import Store
from cloud.store.node_admin import NodeAdminChanges

pytestmark = pytest.mark.timeout(60)


async def test_a_change_is_stamped_after_the_one_it_follows_whatever_the_clock_says(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = iter([100.1, 100.0])  # the later commit read the earlier time
    monkeypatch.setattr(store, "_clock", lambda: next(clock))
    cordoned = await store.change_node_admin("gpu-1", NodeAdminChanges(cordoned=True))
    uncordoned = await store.change_node_admin("gpu-1", NodeAdminChanges(cordoned=False))
    assert uncordoned.updated_at > cordoned.updated_at
    assert (await store.node_admin())["gpu-1"].cordoned is False
