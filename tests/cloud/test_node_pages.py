"""`/v1/nodes` pages: walked with their cursors they give every node once, in order,
while nodes come and go between pages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from hypothesis import given
from hypothesis import strategies as st

from cloud.fleet.node_pages import node_page
from cloud.fleet.registry import NodeRecord

NODE_IDS = st.lists(st.from_regex(r"[a-z0-9-]{1,12}", fullmatch=True), unique=True, max_size=60)


@dataclass(frozen=True)
class Listed:
    node_id: str


def records(node_ids: list[str] | set[str]) -> list[NodeRecord]:
    return cast(list[NodeRecord], [Listed(node_id) for node_id in sorted(node_ids)])


def walk(fleet: list[NodeRecord], limit: int) -> list[str]:
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page, cursor = node_page(fleet, cursor, limit)
        assert len(page) <= limit
        seen += [record.node_id for record in page]
        if cursor is None:
            return seen


@given(NODE_IDS, st.integers(min_value=1, max_value=70))
def test_the_pages_hold_every_node_once_in_order(node_ids: list[str], limit: int) -> None:
    assert walk(records(node_ids), limit) == sorted(node_ids)


@given(NODE_IDS, st.integers(min_value=1, max_value=10))
def test_a_full_page_names_the_next_and_the_last_page_none(node_ids: list[str], limit: int) -> None:
    fleet = records(node_ids)
    page, cursor = node_page(fleet, None, limit)
    if len(fleet) > limit:
        assert cursor == page[-1].node_id
    else:
        assert (page, cursor) == (fleet, None)


@given(NODE_IDS, NODE_IDS, st.integers(min_value=1, max_value=10))
def test_nodes_that_come_and_go_between_pages_leave_the_rest_in_order(
    before: list[str], after: list[str], limit: int
) -> None:
    """The second page is read from a fleet that changed: the nodes it shows are the new
    fleet's after the cursor, whether or not the cursor's node is still there."""
    first, cursor = node_page(records(before), None, limit)
    if cursor is None:
        return
    changed = records(set(after) | {cursor} if len(after) % 2 else set(after) - {cursor})
    second, _ = node_page(changed, cursor, limit)
    expected = sorted(node_id for node_id in {r.node_id for r in changed} if node_id > cursor)
    assert [record.node_id for record in second] == expected[:limit]
    assert all(record.node_id > first[-1].node_id for record in second)
