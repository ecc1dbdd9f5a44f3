"""`greenfed nodes`: the fleet table, read from a running control plane's REST API, and
node enrolment (`join-token create/list/revoke`, `enrolled`, `revoke NODE`, admin).
Each prints as `-o` asks (`greenfed.output`)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final, TextIO

import msgspec
from rich.table import Table
from rich.text import Text

from cloud.fleet.enrolment_views import (
    EnrolledNodeList,
    EnrolledNodeView,
    JoinTokenCreate,
    JoinTokenCreated,
    JoinTokenList,
    JoinTokenView,
    ReadmitResult,
    UnenrolledNodeList,
)
from cloud.fleet.envelope import NodeEnvelope
from cloud.fleet.views import NodeDetail, NodeList, NodeSummary
from greenfed.api_client import ApiClient, bulk_confirmation, path_segment
from greenfed.arguments import EXIT_FAILURE, EXIT_OK
from greenfed.output import Output, emit
from greenfed.work_commands import ago, at_utc, console, plain
from shared.messages import AcceleratorKind
from shared.printable import printable
from shared.taints import CORDON_TAINT_KEY

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
    """The node's accelerators by model, as printable text (a model is the node's word)."""
    groups: dict[tuple[str, str, int], int] = {}
    for accelerator in node.accelerators:
        key = (accelerator.kind, accelerator.model, accelerator.memory_bytes)
        groups[key] = groups.get(key, 0) + 1
    parts = []
    for (kind, model, memory_bytes), count in groups.items():
        if kind == "cpu":
            continue
        memory = f" {_bytes_text(memory_bytes)}" if memory_bytes else ""
        parts.append(f"{count}× {printable(model)}{memory}")
    return ", ".join(parts) or "cpu only"


def _isolation_text(node: NodeSummary) -> Text:
    """How a training node contains work (docs/isolation.md), and whether it runs images."""
    if node.isolation is None:
        return Text()
    if node.isolation == "unavailable":
        return Text("refuses training", style="red")
    return plain(
        node.isolation
        + (" + " + "/".join(node.container_runtimes) if node.container_runtimes else "")
    )


# `-o wide`: beyond the table, what the agent says of itself and when.
NODES_WIDE: Final = ("labels", "agent", "instance", "started (UTC)", "seen (UTC)")


def _labels_text(labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in labels.items())


def render_table(nodes: NodeList, out: TextIO = sys.stdout, *, wide: bool = False) -> None:
    table = Table(title=f"greenfed fleet: {nodes.count} nodes", title_justify="left")
    for column in (
        "node",
        "state",
        "site",
        "zone",
        "region",
        "accelerators",
        "isolation",
        "taints",
        "util %",
        "power W",
        "seen",
    ):
        table.add_column(column, justify="right" if column in ("util %", "power W") else "left")
    for column in NODES_WIDE if wide else ():
        table.add_column(column)
    for node in nodes.items:
        table.add_row(
            node.node_id,
            _state_text(node),
            node.site,
            node.zone,
            node.region,
            plain(_accelerator_text(node)),
            _isolation_text(node),
            plain(", ".join(t for t in node.taints if not t.startswith(CORDON_TAINT_KEY))),
            ""
            if node.accelerator_utilization_pct is None
            else f"{node.accelerator_utilization_pct:.0f}",
            "" if node.power_w is None else f"{node.power_w:.0f}",
            ago(node.last_seen_at),
            *(
                (
                    plain(_labels_text(node.labels)),
                    plain(node.agent_version),
                    plain(node.instance_id),
                    at_utc(node.started_at),
                    at_utc(node.last_seen_at),
                )
                if wide
                else ()
            ),
        )
    screen = console(out, wide=wide)
    screen.print(table)
    online = sum(1 for node in nodes.items if node.state == "online")
    screen.print(f"{online}/{nodes.count} online")


def _state_text(node: NodeSummary) -> Text:
    """Online or offline and why, cordoned, draining and what it waits for, pending
    approval and what differs: the words in parentheses are printable, never markup."""
    if node.state == "online":
        state = Text("online", style="green")
    else:
        state = Text.assemble(("offline", "red"), f" ({node.offline_cause or node.offline_reason})")
    outage = node.last_outage
    if node.state == "online" and outage is not None and _within_hour(outage.ended_at):
        # The same agent came back: it was cut off; a new one: it restarted.
        came_back = "partitioned" if outage.ended_by == "partition" else "restarted"
        state.append(f" ({came_back} {outage.offline_s:.0f} s, {ago(outage.ended_at)})")
    if node.cordoned:
        state.append(" ")
        state.append("draining" if node.draining else "cordoned", style="yellow")
    if node.drain_waiting:  # what the drain waits for (a disruption budget)
        state.append(f" ({printable('; '.join(node.drain_waiting))})")
    if node.approval == "pending-approval":
        state.append(" ")
        state.append("pending-approval", style="magenta")
        state.append(f" ({printable('; '.join(node.approval_differences))})")
    return state


# -- enrolment: join tokens, enrolled identities, revocation --------------------------


def _within_hour(moment: datetime) -> bool:
    return (datetime.now(UTC) - moment).total_seconds() < 3600


async def create_join_token(client: ApiClient, body: JoinTokenCreate, *, output: Output) -> int:
    created = (
        await client.ask(
            "POST", "/v1/nodes/join-tokens", JoinTokenCreated, body=msgspec.json.encode(body)
        )
    ).value
    emit(
        output,
        created,
        lambda: output.out.write(
            f"join token {created.id} (shown only now; {created.max_uses} use"
            f"{'s' if created.max_uses != 1 else ''}, expires {at_utc(created.expires_at)}):\n"
            f"  {created.token}\n"
            "enrol a node with:\n"
            f"  greenfed edge enrol --api {client.target.api} --token {created.token}\n"
        ),
    )
    return EXIT_OK


def _memory_text(size_bytes: int | None) -> str:
    return "" if size_bytes is None else _bytes_text(size_bytes)


def _counts_text(counts: Mapping[AcceleratorKind, int]) -> str:
    return ",".join(f"{kind}={count}" for kind, count in counts.items())


# `-o wide`: what a token's nodes may be beyond where, and who made it when.
JOIN_TOKENS_WIDE: Final = (
    "work", "max accelerators", "models", "max memory", "created (UTC)", "created by",
    "revoked (UTC)",
)  # fmt: skip


def render_join_tokens(tokens: JoinTokenList, out: TextIO, *, wide: bool = False) -> None:
    table = Table(title=f"join tokens: {tokens.count}", title_justify="left")
    for column in ("id", "state", "uses", "expires", "site", "zone", "region", "labels"):
        table.add_column(column)
    for column in JOIN_TOKENS_WIDE if wide else ():
        table.add_column(column)
    for token in tokens.items:
        table.add_row(
            token.id,
            token.state,
            f"{token.uses}/{token.max_uses}",
            at_utc(token.expires_at),
            token.site or "",
            token.zone or "",
            token.region or "",
            plain(_labels_text(token.labels)),
            *(
                (
                    token.work,
                    _counts_text(token.max_accelerators),
                    plain(", ".join(token.accelerator_models)),
                    _memory_text(token.max_accelerator_memory_bytes),
                    at_utc(token.created_at),
                    token.created_by or "",
                    at_utc(token.revoked_at),
                )
                if wide
                else ()
            ),
        )
    console(out, wide=wide).print(table)


async def list_join_tokens(client: ApiClient, *, output: Output) -> int:
    tokens = await client.get("/v1/nodes/join-tokens", JoinTokenList)
    emit(output, tokens, lambda: render_join_tokens(tokens, output.out, wide=output.wide))
    return EXIT_OK


async def revoke_join_token(client: ApiClient, token_id: str, *, output: Output) -> int:
    path = f"/v1/nodes/join-tokens/{path_segment(token_id)}"
    token = (await client.ask("DELETE", path, JoinTokenView)).value
    emit(
        output,
        token,
        lambda: output.out.write(
            f"join token {token.id} revoked ({token.uses} node(s) enrolled with it stay)\n"
        ),
    )
    return EXIT_OK


async def revoke_node(
    client: ApiClient, node_id: str, *, output: Output, confirm_bulk: bool = False
) -> int:
    reply = await client.ask(
        "POST",
        f"/v1/nodes/{path_segment(node_id)}/revoke",
        EnrolledNodeView,
        headers=bulk_confirmation(confirm_bulk),
    )
    node = reply.value
    emit(
        output,
        node,
        lambda: output.out.write(
            f"node {node.node_id} revoked: refused from now on, its broker account disabled; "
            "to admit it again, enrol it with a new join token\n"
        ),
    )
    return EXIT_OK


async def set_node(
    client: ApiClient,
    node_id: str,
    action: str,
    *,
    body: dict[str, object] | None = None,
    output: Output,
    confirm_bulk: bool = False,
) -> int:
    """`cordon`, `uncordon`, `drain` (POST) or `set` (PATCH taints and labels)."""
    path = f"/v1/nodes/{path_segment(node_id)}"
    if action == "set":
        reply = await client.ask("PATCH", path, NodeDetail, body=msgspec.json.encode(body or {}))
    else:
        headers = bulk_confirmation(confirm_bulk)
        reply = await client.ask("POST", f"{path}/{action}", NodeDetail, headers=headers)
    node = reply.value
    state = "cordoned: no new work lands there" if node.cordoned else "schedulable"
    if node.draining:
        state = "draining: cordoned, its work moving elsewhere"
        if node.drain_waiting:
            state += f" ({printable('; '.join(node.drain_waiting))})"
    taints = printable(", ".join(node.taints)) or "none"
    emit(output, node, lambda: output.out.write(f"node {node.node_id} {state}; taints: {taints}\n"))
    return EXIT_OK


async def approve_node(
    client: ApiClient, node_id: str, *, trust_figures: bool, output: Output
) -> int:
    body = msgspec.json.encode({"trust_figures": trust_figures})
    reply = await client.ask(
        "POST", f"/v1/nodes/{path_segment(node_id)}/approve", NodeDetail, body=body
    )
    node = reply.value
    figures = "its own" if node.trusted_figures else "the model table's"
    emit(
        output,
        node,
        lambda: output.out.write(
            f"node {node.node_id} approved as it is now ({_accelerator_text(node)}, {node.site} "
            f"{node.zone} {node.region}); it takes work again; speed and power: {figures}\n"
        ),
    )
    return EXIT_OK


def _envelope_text(envelope: NodeEnvelope | None) -> str:
    """What a node may be, as its enrolment fixed it: place, work and any ceiling."""
    if envelope is None:
        return ""
    where = " ".join(part or "any" for part in (envelope.site, envelope.zone, envelope.region))
    parts = [where, envelope.work]
    if envelope.max_accelerators:
        parts.append("at most " + _counts_text(envelope.max_accelerators))
    if envelope.accelerator_models:
        parts.append(" or ".join(envelope.accelerator_models))
    if envelope.max_accelerator_memory_bytes is not None:
        parts.append(f"≤ {_bytes_text(envelope.max_accelerator_memory_bytes)} each")
    return ", ".join(parts)


async def list_enrolled(client: ApiClient, *, output: Output) -> int:
    nodes = await client.get("/v1/nodes/enrolled", EnrolledNodeList)
    emit(output, nodes, lambda: render_enrolled(nodes, output.out, wide=output.wide))
    return EXIT_OK


def render_enrolled(nodes: EnrolledNodeList, out: TextIO, *, wide: bool = False) -> None:
    """`wide`: also what each may be (its enrolment envelope)."""
    table = Table(title=f"enrolled nodes: {nodes.count}", title_justify="left")
    columns = ("node", "state", "enrolled", "join token", "broker user", "sealing key", "revoked")
    for column in (*columns, "enrolled as") if wide else columns:
        table.add_column(column)
    for node in nodes.items:
        table.add_row(
            node.node_id,
            "[green]enrolled[/]" if node.state == "enrolled" else "[red]revoked[/]",
            at_utc(node.enrolled_at),
            node.join_token_id or "",
            plain(node.username),
            node.sealing_key_fingerprint or "",
            at_utc(node.revoked_at),
            *((plain(_envelope_text(node.envelope)),) if wide else ()),
        )
    console(out, wide=wide).print(table)


async def list_unenrolled(client: ApiClient, *, output: Output) -> int:
    """`greenfed nodes unenrolled`: who a store lost without a backup may re-admit."""
    nodes = await client.get("/v1/nodes/unenrolled", UnenrolledNodeList)
    emit(output, nodes, lambda: render_unenrolled(nodes, output.out, wide=output.wide))
    return EXIT_OK


# `-o wide`: where each enrolled, with which token, and when it was first and last seen.
UNENROLLED_WIDE: Final = ("cluster", "join token", "instance", "first seen (UTC)", "seen (UTC)")


def render_unenrolled(nodes: UnenrolledNodeList, out: TextIO, *, wide: bool = False) -> None:
    table = Table(
        title=f"nodes proving an enrolment this control plane lost: {nodes.count}",
        title_justify="left",
    )
    columns = ("node", "state", "enrolled", "as", "now", "sealing key", "last seen")
    for column in (*columns, *UNENROLLED_WIDE) if wide else columns:
        table.add_column(column)
    for node in nodes.items:
        envelope = node.envelope
        enrolled_as = " ".join(
            part or "any" for part in (envelope.site, envelope.zone, envelope.region)
        )
        table.add_row(
            node.node_id,
            {"unenrolled": "[yellow]unenrolled[/]", "revoked": "[red]revoked[/]"}.get(
                node.state, node.state
            ),
            at_utc(node.enrolled_at),
            plain(f"{enrolled_as}, {envelope.work}"),
            plain(f"{node.site} {node.zone} {node.region}"),
            node.sealing_key_fingerprint,
            ago(node.last_seen_at),
            *(
                (
                    plain(node.cluster_id),
                    node.join_token_id or "",
                    plain(node.instance_id),
                    at_utc(node.first_seen_at),
                    at_utc(node.last_seen_at),
                )
                if wide
                else ()
            ),
        )
    console(out, wide=wide).print(table)


async def readmit_nodes(
    client: ApiClient,
    node_ids: list[str],
    *,
    every: bool,
    output: Output,
) -> int:
    """`greenfed nodes readmit`: enrol nodes again as their certificates say; fails
    (exit 1) when a named node was not re-admitted."""
    body = msgspec.json.encode({"all": True} if every else {"node_ids": node_ids})
    result = (await client.ask("POST", "/v1/nodes/readmit", ReadmitResult, body=body)).value

    def said() -> None:
        out = output.out
        out.write(f"re-admitted {len(result.readmitted)} node(s)\n")
        for node in result.readmitted:
            out.write(f"  {node.node_id}  sealing key {node.sealing_key_fingerprint}\n")
        for refusal in result.refused:
            detail = printable(refusal.detail)
            out.write(f"not re-admitted: {refusal.node_id}: {refusal.reason}: {detail}\n")

    emit(output, result, said)
    return EXIT_FAILURE if result.refused else EXIT_OK
