"""Measured utilisation beside the nodes (issue 28): ``Snapshot.build(utilisation=...)``
takes a newer sample's shares over the pools' own, so that the live loop remakes no
node for a sample. Through a ``NodeTableCache`` or not, the snapshot must be the one
of the nodes remade with those shares, after any history of samples, remade nodes and
structural changes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud.scheduler import AcceleratorPool, Node, NodeTableCache, Snapshot
from cloud.scheduler import snapshot as snapshot_module

from .builders import NOW, gpu_node


def _mig_node(node_id: str) -> Node:
    """Whole A100s beside a GPU split into slices: two GPU pools (a second column)."""
    node = gpu_node(node_id, 2, cpu_cores=16, host_memory_gib=64)
    slices = AcceleratorPool(
        kind="gpu", count=7, model="A100 MIG 1g.10gb", memory_bytes=10 << 30, relative_speed=1 / 7
    )
    return dataclasses.replace(node, pools=(node.pools[0], slices, node.pools[1]))


def _fleet() -> dict[str, Node]:
    return {
        "a": gpu_node("a", 8, cpu_cores=32, host_memory_gib=256),
        "b": gpu_node("b", 4, zone="US-CAL-CISO", timezone="America/Los_Angeles"),
        "c": _mig_node("c"),
        "d": gpu_node("d", 8, model="H100", speed=2.0),
    }


def _with_shares(node: Node, shares: Sequence[float]) -> Node:
    pools = tuple(
        dataclasses.replace(pool, utilisation=share)
        for pool, share in zip(node.pools, shares, strict=True)
    )
    return dataclasses.replace(node, pools=pools)


def _assert_same(built: Snapshot, fresh: Snapshot) -> None:
    table, expected = built.nodes, fresh.nodes
    for field in dataclasses.fields(table):
        value, wanted = getattr(table, field.name), getattr(expected, field.name)
        if field.name == "kinds":
            for column, other in zip(value, wanted, strict=True):
                for item in dataclasses.fields(column):
                    np.testing.assert_equal(getattr(column, item.name), getattr(other, item.name))
        else:
            if isinstance(value, Mapping):
                value, wanted = dict(value), dict(wanted)
            np.testing.assert_equal(value, wanted, field.name)


_share = st.floats(0.0, 1.0, allow_nan=False)
_step: st.SearchStrategy[tuple[str, str, list[float]]] = st.one_of(
    st.tuples(st.just("sample"), st.sampled_from("abcd"), st.lists(_share, min_size=3, max_size=3)),
    st.tuples(st.just("remake"), st.sampled_from("abcd"), st.just([])),
    st.tuples(st.just("forget"), st.sampled_from("abcd"), st.just([])),
    st.tuples(st.just("drop"), st.sampled_from("abcd"), st.just([])),
    st.tuples(st.just("flip"), st.sampled_from("abcd"), st.just([])),
    st.tuples(st.just("resize"), st.sampled_from("abd"), st.just([])),
    st.tuples(st.just("leave"), st.sampled_from("abcd"), st.just([])),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_step, min_size=1, max_size=25))
def test_the_cached_table_with_measured_shares_is_the_fresh_table_of_remade_nodes(
    steps: list[tuple[str, str, list[float]]],
) -> None:
    nodes = _fleet()
    measured: dict[str, tuple[float, ...]] = {}
    cache = NodeTableCache()
    for number, (action, node_id, shares) in enumerate(steps):
        node = nodes.get(node_id)
        if node is None:
            nodes[node_id] = _fleet()[node_id]  # it joins again
        elif action == "sample":
            measured[node_id] = tuple(shares[: len(node.pools)])
        elif action == "remake":  # as NodeViews does when the record changed
            if node_id in measured:
                nodes[node_id] = _with_shares(node, measured.pop(node_id))
        elif action == "forget":  # a share the same as the node's own, say
            measured.pop(node_id, None)
            nodes[node_id] = _with_shares(node, [0.0] * len(node.pools))
        elif action == "drop":  # back to the node's own figure
            measured.pop(node_id, None)
        elif action == "flip":  # offline, or back
            nodes[node_id] = dataclasses.replace(node, healthy=not node.healthy)
        elif action == "resize":
            gpus = dataclasses.replace(node.pools[0], count=node.pools[0].count % 8 + 1)
            nodes[node_id] = dataclasses.replace(node, pools=(gpus, *node.pools[1:]))
        else:
            del nodes[node_id]
            measured.pop(node_id, None)
        now = NOW + 3600.0 * number
        remade = [_with_shares(n, measured[i]) if i in measured else n for i, n in nodes.items()]
        fresh = Snapshot.build(now=now, nodes=remade)
        for tables in (None, cache):
            built = Snapshot.build(
                now=now, nodes=list(nodes.values()), utilisation=measured, tables=tables
            )
            _assert_same(built, fresh)


@pytest.mark.parametrize(
    ("utilisation", "words"),
    [
        ({"nobody": (0.5,)}, "unknown node 'nobody'"),
        ({"a": (0.5,)}, "one measured utilisation per pool"),
        ({"a": (0.5, 1.5)}, "within 0..1"),
        ({"a": (float("nan"), 0.0)}, "within 0..1"),
    ],
)
def test_measured_shares_that_do_not_fit_the_nodes_are_refused(
    utilisation: dict[str, tuple[float, ...]], words: str
) -> None:
    nodes = list(_fleet().values())
    for tables in (None, NodeTableCache()):
        with pytest.raises(ValueError, match=words):
            Snapshot.build(now=NOW, nodes=nodes, utilisation=utilisation, tables=tables)


def test_a_node_going_offline_or_coming_back_patches_the_table_instead_of_building_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Somewhere in a fleet of thousands a node changes state most minutes: a fresh
    # build of all the columns for it cost 90 ms at 10,000 nodes.
    nodes = _fleet()
    cache = NodeTableCache()
    Snapshot.build(now=NOW, nodes=list(nodes.values()), tables=cache)
    builds: list[int] = []
    fresh_columns = snapshot_module._node_columns

    def counted(*args: object) -> object:
        builds.append(1)
        return fresh_columns(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(snapshot_module, "_node_columns", counted)
    nodes["b"] = dataclasses.replace(nodes["b"], healthy=False)
    measured = {"c": (0.25, 0.5, 0.75)}
    built = Snapshot.build(now=NOW, nodes=list(nodes.values()), utilisation=measured, tables=cache)
    assert not builds
    assert built.nodes.healthy.tolist() == [True, False, True, True]
    monkeypatch.undo()
    remade = [_with_shares(n, measured[i]) if i in measured else n for i, n in nodes.items()]
    _assert_same(built, Snapshot.build(now=NOW, nodes=remade))
