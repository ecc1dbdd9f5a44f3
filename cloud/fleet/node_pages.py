"""`/v1/nodes` pages at fleet scale: each node's JSON kept, encoded again only in the
part that changed.

A page of 1,000 nodes built every summary from its record and encoded it whole: tens of
microseconds a node, and a page walked the whole sorted fleet to find its start. Here:

- The fleet sorted by node id, and each filter's matches, are kept by
  `NodeRegistry.version` (bumped by every birth, state change, approval change, admin
  change and departure: everything a filter reads), so a page is found by bisection
  without sorting or scanning 10,000 records again.
- A summary's fields are of four parts (cloud/fleet/views.py): what the node's birth,
  an admin, its approval and its drain say, which changes rarely; its state and
  outages; its latest sample, which changes every few seconds; its latest report. In
  `NodeSummary`'s order the birth fields are runs around the three live parts. Each
  node's JSON is kept with its parts, and a part is encoded again only when what it is
  made of is not the same any more (a new birth, a new sample, ...): the node's JSON is
  then one template filled with its parts, and a page a join of bytes.

The body is `msgspec.json.encode(NodeList(...))`, byte for byte (tests/cloud/
test_node_page_cache.py): a part's bytes are the encoding of a dict of its fields in
the struct's order, without the braces, and msgspec writes a struct's fields as it
writes such a dict's. Memory: each node's parts and JSON, about 4 KB a node.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from cloud.fleet.registry import NodeFilter, NodeRecord, NodeRegistry
from cloud.fleet.views import (
    REPORT_FIELDS,
    SAMPLE_FIELDS,
    STATE_FIELDS,
    NodeSummary,
    summary_birth_fields,
    summary_report_fields,
    summary_sample_fields,
    summary_state_fields,
)

_NODE_ID = operator.attrgetter("node_id")
# Filters whose matches are kept at once (a dashboard's few views); the oldest goes.
MAX_KEPT_FILTERS = 16


def node_page(
    records: list[NodeRecord], cursor: str | None, limit: int
) -> tuple[list[NodeRecord], str | None]:
    """The page of `records` (sorted by node id) after `cursor`, and the next page's cursor
    (None: this is the last). The cursor is the last node id of the page before: a node
    id, not a position, so pages stay right while nodes come and go; it need not be a
    node any more. Found by bisection: a page costs its own nodes, not the fleet's."""
    start = 0 if cursor is None else bisect.bisect_right(records, cursor, key=_NODE_ID)
    page = records[start : start + limit]
    return page, (page[-1].node_id if start + limit < len(records) else None)


# What each part of a summary is made of (compared by `==`, which a tuple answers by
# identity first: a birth, a sample, an admin record are replaced, never changed in
# place), and how it is written.
def _birth_key(record: NodeRecord, drain_waiting: tuple[str, ...]) -> tuple[object, ...]:
    return (record.status, record.admin, record.awaiting_approval, drain_waiting)


def _state_key(record: NodeRecord) -> tuple[object, ...]:
    return (record.state, record.offline_reason, record.offline_cause, record.last_outage)


def _sample_key(record: NodeRecord) -> tuple[object, ...]:
    return (record.telemetry, record.last_seen_at)


def _report_key(record: NodeRecord) -> tuple[object, ...]:
    return (record.reported,)


_LivePart = tuple[
    tuple[str, ...],
    Callable[[NodeRecord], tuple[object, ...]],
    Callable[[NodeRecord], dict[str, object]],
]
_LIVE_PARTS: tuple[_LivePart, ...] = (
    (STATE_FIELDS, _state_key, summary_state_fields),
    (SAMPLE_FIELDS, _sample_key, summary_sample_fields),
    (REPORT_FIELDS, _report_key, summary_report_fields),
)


def _birth_runs() -> tuple[tuple[str, ...], ...]:
    """`NodeSummary`'s fields outside the live parts, as the runs between them: the
    summary is birth run, live part, birth run, ..., birth run."""
    live_names = [names for names, _, _ in _LIVE_PARTS]
    runs: list[list[str]] = [[]]
    fields = NodeSummary.__struct_fields__
    position = 0
    for names in live_names:
        start = fields.index(names[0])
        # Each live part is consecutive fields, in order, with birth fields around it.
        assert fields[start : start + len(names)] == names, names
        assert start > position, names
        runs[-1] += fields[position:start]
        runs.append([])
        position = start + len(names)
    runs[-1] += fields[position:]
    assert all(runs), "a birth run between every two live parts"
    return tuple(tuple(run) for run in runs)


_BIRTH_RUNS = _birth_runs()
_ENCODER = msgspec.json.Encoder()


def _members(fields: dict[str, object], names: tuple[str, ...]) -> bytes:
    """`fields`' `names` as JSON members, `"a":1,"b":2`: the encoding of that dict
    without its braces, as msgspec writes those fields of a struct."""
    return _ENCODER.encode({name: fields[name] for name in names})[1:-1]


@dataclass(slots=True)
class _Kept:
    """One node's JSON, and its parts with what each was made of: the birth runs, then
    the live parts in `_LIVE_PARTS`' order."""

    keys: list[tuple[object, ...]]
    parts: list[bytes]
    json: bytes


class NodePages:
    """Pages of the registry's nodes, sorted by node id, as `NodeList` JSON."""

    def __init__(self, registry: NodeRegistry) -> None:
        self._registry = registry
        self._version: int | None = None
        self._matching: dict[NodeFilter, list[NodeRecord]] = {}
        self._kept: dict[str, _Kept] = {}

    def matching(self, node_filter: NodeFilter) -> list[NodeRecord]:
        """The nodes `node_filter` matches, sorted by node id (kept: do not change it)."""
        version = self._registry.version
        if version != self._version:
            self._matching.clear()
            self._version = version
            if len(self._kept) > len(self._registry):  # nodes gone: forget their JSON
                self._kept = {
                    k: v for k, v in self._kept.items() if self._registry.get(k) is not None
                }
        found = self._matching.get(node_filter)
        if found is None:
            found = self._registry.nodes(node_filter)
            if len(self._matching) >= MAX_KEPT_FILTERS:
                del self._matching[next(iter(self._matching))]
            self._matching[node_filter] = found
        return found

    def page(
        self,
        node_filter: NodeFilter,
        cursor: str | None,
        limit: int,
        drain_waiting: Callable[[NodeRecord], tuple[str, ...]],
    ) -> bytes:
        """The `NodeList` after `cursor` (the last node id of the page before; it need
        not be a node any more), at most `limit` nodes, as JSON."""
        records = self.matching(node_filter)
        page, next_cursor = node_page(records, cursor, limit)
        items = b",".join([self.node_json(record, drain_waiting(record)) for record in page])
        tail = _ENCODER.encode(
            {"count": len(page), "total": len(records), "next_cursor": next_cursor}
        )
        return b'{"items":[' + items + b"]," + tail[1:]

    def node_json(self, record: NodeRecord, drain_waiting: tuple[str, ...] = ()) -> bytes:
        """`msgspec.json.encode(node_summary(record, drain_waiting))`, from what is kept."""
        kept = self._kept.get(record.node_id)
        birth_key = _birth_key(record, drain_waiting)
        if kept is None or kept.keys[0] != birth_key:
            # A new birth (or admin, approval, drain): every part is written again.
            fields = summary_birth_fields(record) | {"drain_waiting": drain_waiting}
            keys = [birth_key]
            parts = [_members(fields, names) for names in _BIRTH_RUNS]
            for names, key, fields_of in _LIVE_PARTS:
                keys.append(key(record))
                parts.append(_members(fields_of(record), names))
            kept = self._kept[record.node_id] = _Kept(keys, parts, _joined(parts))
            return kept.json
        changed = False
        for number, (names, key, fields_of) in enumerate(_LIVE_PARTS, start=1):
            now = key(record)
            if kept.keys[number] != now:
                kept.keys[number] = now
                kept.parts[len(_BIRTH_RUNS) + number - 1] = _members(fields_of(record), names)
                changed = True
        if changed:
            kept.json = _joined(kept.parts)
        return kept.json


_LIVE_COUNT = len(_LIVE_PARTS)
# A node's parts (birth runs, then live parts) in field order: birth run and live part
# alternating, written into one template by one call.
_IN_FIELD_ORDER = operator.itemgetter(
    *(
        index
        for birth in range(_LIVE_COUNT + 1)
        for index in (birth, _LIVE_COUNT + 1 + birth)
        if index < 2 * _LIVE_COUNT + 1
    )
)
_TEMPLATE = b"{" + b",".join([b"%b"] * (2 * _LIVE_COUNT + 1)) + b"}"


def _joined(parts: list[bytes]) -> bytes:
    """A node's JSON from its parts (birth runs, then live parts)."""
    joined: bytes = _TEMPLATE % _IN_FIELD_ORDER(parts)
    return joined
