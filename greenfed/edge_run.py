"""`greenfed edge run`, apart from the rest of the command line.

The upgrade supervisor starts the agent as `python -m greenfed edge run ...`
(edge/upgrade/supervisor.py), and `greenfed/__main__.py` sends that here: the agent runs
for months, and the whole command line (every command's module and parser) would cost
it about 1 MB for nothing. `greenfed edge run` through the whole command line (the
`greenfed` script, which then becomes the supervisor) parses the same options and runs
the same `cmd_edge_run`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Final

from greenfed.arguments import (
    add_settings_options,
    positive_float,
    run_command,
    settings_from_options,
)

EDGE_RUN_HELP: Final = "run the agent on this machine"


def add_edge_run_options(parser: argparse.ArgumentParser) -> None:
    add_settings_options(parser)
    parser.add_argument("--telemetry-interval", type=positive_float, metavar="SECONDS")
    parser.add_argument(
        "--no-supervisor",
        action="store_true",
        help="run the agent in this process: no upgrades over the air (nothing could roll "
        "a failed one back)",
    )


def cmd_edge_run(args: argparse.Namespace) -> int:
    settings = settings_from_options(args)  # a broken configuration fails here, first
    from edge.upgrade.supervisor import is_supervised, replace_with_supervisor
    from edge.upgrade.versions import DIRECTORY_NAME

    if not args.no_supervisor and not is_supervised():
        # This process becomes the upgrade supervisor, which runs the agent as its child
        # (`greenfed edge run` again, in the version it chooses): edge/upgrade/supervisor.py.
        versions_dir = settings.agent.resolved_data_dir() / DIRECTORY_NAME
        replace_with_supervisor(versions_dir, args.argv)
    from edge.main import run_agent
    from shared.logs import configure_logging
    from shared.runtime import run_main

    configure_logging(settings.log.level, settings.log.format)
    return run_main(lambda stop: run_agent(settings, stop, args.config))


def main(argv: Sequence[str]) -> int:
    """`argv`: greenfed's arguments, `edge run` first."""
    if list(argv[:2]) != ["edge", "run"]:
        raise ValueError(f"not an `edge run` command line: {list(argv)}")
    parser = argparse.ArgumentParser(prog="greenfed edge run")
    add_edge_run_options(parser)
    parser.set_defaults(handler=cmd_edge_run)
    args = parser.parse_args(argv[2:])
    del parser  # an agent runs for months
    args.argv = list(argv)  # the upgrade supervisor's child's
    return run_command(args)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
