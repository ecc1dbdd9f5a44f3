"""Fixtures of tests/edge: a node whose workers run through the real sandbox."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.sandboxed_node import SandboxedNode, make_node, require_isolation_tools


@pytest.fixture(params=["sandbox", "user"])
def node(request: pytest.FixtureRequest) -> Iterator[SandboxedNode]:
    """A node at each isolation level that switches users, in turn."""
    require_isolation_tools()
    yield from make_node(request.param)


@pytest.fixture
def sandbox_node() -> Iterator[SandboxedNode]:
    require_isolation_tools()
    yield from make_node("sandbox")
