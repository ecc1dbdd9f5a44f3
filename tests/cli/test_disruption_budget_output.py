"""What a person reads of a disruption budget: `greenfed deployment ID` shows the
deployment's `min_available`, and `greenfed nodes` what a draining node waits for."""

from __future__ import annotations

import io

import msgspec
import pytest

from cloud.fleet.views import NodeList, node_summary
from greenfed.nodes_cli import render_table
from greenfed.work_commands import render_work
from tests.cli.test_deployment_output import _deployment
from tests.loop.builders import node

WAITING = "waiting: detector would fall below min_available 2 (1 serving elsewhere)"


def test_greenfed_deployment_shows_min_available() -> None:
    shown = _deployment()
    spec = msgspec.structs.replace(shown.spec, min_available=2)
    out = io.StringIO()
    render_work(msgspec.structs.replace(shown, spec=spec), None, out)
    assert "min_available: 2 (kept serving through drains, preemption and rollouts)" in (
        out.getvalue()
    )
    out = io.StringIO()
    render_work(shown, None, out)
    assert "min_available" not in out.getvalue()


def test_greenfed_nodes_says_what_a_drain_waits_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    record = node("orin-0")
    summary = msgspec.structs.replace(
        node_summary(record), cordoned=True, draining=True, drain_waiting=(WAITING,)
    )
    out = io.StringIO()
    render_table(NodeList(items=(summary,), count=1, total=1, next_cursor=None), out, wide=True)
    assert "draining" in out.getvalue()
    assert WAITING in out.getvalue()
