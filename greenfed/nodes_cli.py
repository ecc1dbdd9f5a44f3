"""`greenfed nodes`: the fleet table, read from a running control plane's REST API."""

from __future__ import annotations

import sys
from typing import TextIO

from rich.table import Table

from cloud.fleet.views import NodeList, NodeSummary
from greenfed.api_client import ApiClient
from greenfed.work_commands import ago, console

GIB = 1024**3


async def fetch_nodes(client: ApiClient, params: dict[str, str]) -> NodeList:
    """Every page of `/v1/nodes` matching `params`, as one list."""
    items: list[NodeSummary] = []
    cursor: str | None = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        page = await client.get("/v1/nodes", NodeList, params=query)
        items.extend(page.items)
        cursor = page.next_cursor
        if cursor is None:
            return NodeList(
                items=tuple(items), count=len(items), total=page.total, next_cursor=None
            )


def _bytes_text(size_bytes: int) -> str:
    if size_bytes >= GIB:
        return f"{size_bytes / GIB:.0f} GiB"
    return f"{size_bytes / 1024**2:.0f} MiB"


def _accelerator_text(node: NodeSummary) -> str:
    groups: dict[tuple[str, str, int], int] = {}
    for accelerator in node.accelerators:
        key = (accelerator.kind, accelerator.model, accelerator.memory_bytes)
        groups[key] = groups.get(key, 0) + 1
    parts = []
    for (kind, model, memory_bytes), count in groups.items():
        if kind == "cpu":
            continue
        memory = f" {_bytes_text(memory_bytes)}" if memory_bytes else ""
        parts.append(f"{count}× {model}{memory}")
    return ", ".join(parts) or "cpu only"


def render_table(nodes: NodeList, out: TextIO = sys.stdout) -> None:
    table = Table(title=f"greenfed fleet: {nodes.count} nodes", title_justify="left")
    for column in (
        "node",
        "state",
        "site",
        "zone",
        "region",
        "accelerators",
        "util %",
        "power W",
        "seen",
    ):
        table.add_column(column, justify="right" if column in ("util %", "power W") else "left")
    for node in nodes.items:
        state = (
            "[green]online[/]"
            if node.state == "online"
            else f"[red]offline[/] ({node.offline_reason})"
        )
        table.add_row(
            node.node_id,
            state,
            node.site,
            node.zone,
            node.region,
            _accelerator_text(node),
            ""
            if node.accelerator_utilization_pct is None
            else f"{node.accelerator_utilization_pct:.0f}",
            "" if node.power_w is None else f"{node.power_w:.0f}",
            ago(node.last_seen_at),
        )
    screen = console(out)
    screen.print(table)
    online = sum(1 for node in nodes.items if node.state == "online")
    screen.print(f"{online}/{nodes.count} online")
