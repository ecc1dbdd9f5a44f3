"""What `greenfed agent-packages` and `greenfed nodes upgrade|rollouts` do
(greenfed/upgrade_cli.py): calls to the control plane's agent-upgrade API
(cloud/api/agent_upgrades.py), printed as `-o` asks (`greenfed.output`)."""

from __future__ import annotations

import argparse
import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import msgspec
from rich.table import Table

from cloud.upgrades.views import PackageList, PackageView, RolloutList, RolloutView
from greenfed.api_client import ApiClient, CliError, path_segment
from greenfed.arguments import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from greenfed.output import Output, emit
from greenfed.work_commands import at_utc, console, get_and_show, plain
from shared.printable import printable

WATCH_INTERVAL_S = 2.0


def _moment(epoch_s: float | None) -> str:
    return "" if epoch_s is None else at_utc(datetime.fromtimestamp(epoch_s, tz=UTC))


# ---- packages ----------------------------------------------------------------------------


def render_packages(packages: PackageList, out: TextIO, *, wide: bool = False) -> None:
    table = Table(title=f"agent packages: {packages.count}", title_justify="left")
    for column in ("version", "size", "sha256", "published"):
        table.add_column(column)
    if wide:
        table.add_column("published by")
        table.add_column("signature")
    for package in packages.items:
        table.add_row(
            plain(package.version),
            f"{package.size_bytes / 1e6:.1f} MB",
            package.sha256 if wide else package.sha256[:12],
            _moment(package.published_at),
            *((plain(package.published_by), package.signature) if wide else ()),
        )
    console(out, wide=wide).print(table)


async def publish_package(client: ApiClient, wheel: Path, *, output: Output) -> int:
    if not await asyncio.to_thread(wheel.is_file):
        raise CliError(f"{wheel}: no such file", EXIT_USAGE)
    reply = await client.upload("/v1/agent-packages", wheel, {}, PackageView)
    package = reply.value
    emit(
        output,
        reply.payload,
        lambda: output.out.write(
            f"agent {package.version} published (sha256 {package.sha256}, "
            f"{package.size_bytes} bytes, signed); roll it out with "
            f"`greenfed nodes upgrade --version {package.version}`\n"
        ),
    )
    return EXIT_OK


async def list_packages(client: ApiClient, *, output: Output) -> int:
    return await get_and_show(
        client,
        "/v1/agent-packages",
        PackageList,
        lambda packages: render_packages(packages, output.out, wide=output.wide),
        output=output,
    )


# ---- rollouts ----------------------------------------------------------------------------


def _progress(rollout: RolloutView) -> str:
    counts = ", ".join(f"{count} {state}" for state, count in rollout.counts.items())
    wave = f"wave {rollout.current_wave + 1} of {len(rollout.waves)}" if rollout.waves else ""
    # The detail may quote a node's words (why its upgrade failed): printable.
    detail = f": {printable(rollout.detail)}" if rollout.detail else ""
    version = printable(rollout.version)
    return f"rollout {rollout.rollout_id} of agent {version}: {rollout.phase}{detail}" + (
        f" ({wave}; {counts})" if counts else ""
    )


def render_rollouts(rollouts: RolloutList, out: TextIO, *, wide: bool = False) -> None:
    table = Table(title=f"agent rollouts: {rollouts.count}", title_justify="left")
    for column in ("rollout", "version", "phase", "wave", "upgraded", "failed", "upgrading",
                   "waiting", "skipped", "started"):  # fmt: skip
        table.add_column(column)
    if wide:
        for column in ("finished", "canary", "max failure", "detail"):
            table.add_column(column)
    for rollout in rollouts.items:
        counts = rollout.counts
        table.add_row(
            rollout.rollout_id,
            plain(rollout.version),
            rollout.phase,
            f"{rollout.current_wave + 1}/{len(rollout.waves)}" if rollout.waves else "-",
            *(
                str(counts.get(state, 0))
                for state in ("upgraded", "failed", "upgrading", "waiting", "skipped")
            ),
            _moment(rollout.created_at),
            *(
                (
                    _moment(rollout.finished_at),
                    f"{rollout.rules.canary_percent:g}%",
                    f"{100 * rollout.rules.max_failure_share:g}%",
                    plain(rollout.detail),
                )
                if wide
                else ()
            ),
        )
    console(out, wide=wide).print(table)


def render_rollout(rollout: RolloutView, out: TextIO, *, wide: bool = False) -> None:
    out.write(_progress(rollout) + "\n")
    for wave in rollout.waves:
        out.write(
            f"  wave {wave.wave + 1}: {wave.nodes} nodes, {wave.upgraded} upgraded, "
            f"{wave.failed} failed, {wave.upgrading} upgrading, {wave.waiting} waiting\n"
        )
    table = Table(title="nodes", title_justify="left")
    for column in ("node", "wave", "state", "since", "detail"):
        table.add_column(column)
    for node_id, entry in rollout.nodes.items():
        if not wide and entry.state in ("upgraded", "waiting"):
            continue  # the interesting ones; -o wide lists every node
        table.add_row(
            plain(node_id),
            str(entry.wave + 1),
            entry.state,
            _moment(entry.changed_at),
            plain(entry.detail),  # a node's words, e.g. why its upgrade failed
        )
    if table.row_count:
        console(out, wide=wide).print(table)


async def start_rollout(client: ApiClient, args: argparse.Namespace, *, output: Output) -> int:
    nodes = [node for value in args.nodes or () for node in value.split(",") if node]
    body = {
        "version": args.version,
        "nodes": nodes,
        "canary_percent": args.canary,
        "max_failure_share": args.max_failures / 100,
        "health_timeout_s": args.health_timeout,
        "wave_timeout_s": args.wave_timeout,
    }
    reply = await client.ask(
        "POST", "/v1/agent-rollouts", RolloutView, body=msgspec.json.encode(body)
    )
    rollout = reply.value
    emit(output, reply.payload, lambda: output.out.write(_progress(rollout) + "\n"))
    if not args.watch:
        return EXIT_OK
    return await watch_rollout(client, rollout.rollout_id, output=output)


async def watch_rollout(client: ApiClient, rollout_id: str, *, output: Output) -> int:
    """Print each change until the rollout is over; exit 0 only if it succeeded."""
    last = ""
    while True:
        rollout = await client.get(f"/v1/agent-rollouts/{path_segment(rollout_id)}", RolloutView)
        line = _progress(rollout)
        if line != last and output.format in ("table", "wide"):
            output.out.write(line + "\n")
            output.out.flush()
        last = line
        if rollout.phase != "running":
            if output.format not in ("table", "wide"):
                emit(output, rollout, lambda: None)
            return EXIT_OK if rollout.phase == "succeeded" else EXIT_FAILURE
        await asyncio.sleep(WATCH_INTERVAL_S)


async def show_rollouts(client: ApiClient, args: argparse.Namespace, *, output: Output) -> int:
    if args.rollout is None:
        return await get_and_show(
            client,
            "/v1/agent-rollouts",
            RolloutList,
            lambda rollouts: render_rollouts(rollouts, output.out, wide=output.wide),
            output=output,
        )
    path = f"/v1/agent-rollouts/{path_segment(args.rollout)}"
    if args.cancel:
        reply = await client.ask("POST", f"{path}/cancel", RolloutView)
    elif args.watch:
        return await watch_rollout(client, args.rollout, output=output)
    else:
        reply = await client.ask("GET", path, RolloutView)
    rollout = reply.value
    emit(output, reply.payload, lambda: render_rollout(rollout, output.out, wide=output.wide))
    return EXIT_OK
