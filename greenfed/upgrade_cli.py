"""Agent upgrades over the air from the command line (admin), through a running control
plane's REST API (cloud/api/agent_upgrades.py):

- `greenfed agent-packages publish WHEEL` / `list`: the agent versions it serves;
- `greenfed nodes upgrade --version V [--canary N%] [--nodes A,B] [--watch]`: a rollout;
- `greenfed nodes rollouts [ID] [--cancel|--watch]`: how rollouts went, node by node.

The parser only: what each command does is greenfed/upgrade_commands.py, imported when
it runs (an agent's `greenfed` builds this parser too)."""

from __future__ import annotations

import argparse
from pathlib import Path

from greenfed.arguments import percentage, positive_float
from greenfed.output import ACTION_FORMATS, output_of
from greenfed.work_cli import add_client_options, run_client

# ---- the command line --------------------------------------------------------------------


def cmd_agent_packages(args: argparse.Namespace) -> int:
    from greenfed.upgrade_commands import list_packages, publish_package

    output = output_of(args)
    if args.packages_command == "publish":
        return run_client(
            args, lambda client: publish_package(client, args.wheel, output=output), timeout_s=None
        )
    return run_client(args, lambda client: list_packages(client, output=output))


def cmd_nodes_upgrade(args: argparse.Namespace) -> int:
    from greenfed.upgrade_commands import start_rollout

    return run_client(
        args,
        lambda client: start_rollout(client, args, output=output_of(args)),
        timeout_s=None if args.watch else 30.0,
    )


def cmd_nodes_rollouts(args: argparse.Namespace) -> int:
    from greenfed.upgrade_commands import show_rollouts

    return run_client(
        args,
        lambda client: show_rollouts(client, args, output=output_of(args)),
        timeout_s=None if args.watch else 30.0,
    )


def add_upgrade_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    nodes_commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """`greenfed agent-packages …` beside the other commands, and `upgrade` and
    `rollouts` under `greenfed nodes`."""
    packages = commands.add_parser(
        "agent-packages", help="agent versions the control plane serves for upgrades (admin)"
    )
    packages_commands = packages.add_subparsers(
        dest="packages_command", metavar="COMMAND", required=True
    )
    publish = packages_commands.add_parser(
        "publish", help="publish a greenfed wheel as an agent version (checked and signed)"
    )
    add_client_options(publish, formats=ACTION_FORMATS)
    publish.add_argument("wheel", type=Path, metavar="WHEEL", help="a greenfed .whl file")
    publish.set_defaults(handler=cmd_agent_packages)
    listing = packages_commands.add_parser("list", help="the published agent versions")
    add_client_options(listing)
    listing.set_defaults(handler=cmd_agent_packages)

    upgrade = nodes_commands.add_parser(
        "upgrade", help="roll an agent version out to the fleet in waves (admin)"
    )
    add_client_options(upgrade, formats=ACTION_FORMATS, nested=True)
    upgrade.add_argument("--version", required=True, help="a published agent version")
    upgrade.add_argument(
        "--nodes", action="append", metavar="A,B", help="only these nodes (default: every node)"
    )
    upgrade.add_argument(
        "--canary",
        type=percentage,
        default="10%",
        metavar="N%",
        help="the first wave's share of nodes (10%%)",
    )
    upgrade.add_argument(
        "--max-failures",
        type=percentage,
        default="20%",
        metavar="N%",
        help="a wave whose failed share passes this halts the rollout (20%%)",
    )
    upgrade.add_argument(
        "--health-timeout",
        type=positive_float,
        default=120.0,
        metavar="SECONDS",
        help="how long a new version has to announce itself before the node rolls back",
    )
    upgrade.add_argument(
        "--wave-timeout",
        type=positive_float,
        default=900.0,
        metavar="SECONDS",
        help="a node that has not answered within this counts as failed",
    )
    upgrade.add_argument("--watch", action="store_true", help="follow it until it is over")
    upgrade.set_defaults(handler=cmd_nodes_upgrade)

    rollouts = nodes_commands.add_parser(
        "rollouts", help="agent rollouts, or one of them node by node (admin)"
    )
    add_client_options(rollouts, nested=True)
    rollouts.add_argument("rollout", nargs="?", metavar="ROLLOUT", help="a rollout's id")
    action = rollouts.add_mutually_exclusive_group()
    action.add_argument("--cancel", action="store_true", help="cancel the running rollout")
    action.add_argument("--watch", action="store_true", help="follow it until it is over")
    rollouts.set_defaults(handler=cmd_nodes_rollouts)
