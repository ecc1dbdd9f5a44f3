"""`greenfed edge run`, apart from the rest of the command line.

The upgrade supervisor starts the agent as `python -m greenfed edge run ...`
(edge/upgrade/supervisor.py), and `greenfed/__main__.py` sends that here: the agent runs
for months, and the whole command line (every command's module and parser) would cost
it about 1 MB for nothing. `greenfed edge run` through the whole command line (the
`greenfed` script, which then becomes the supervisor) parses the same options and runs
the same `cmd_edge_run`.

Here a command line of the options alone, each with a valid value, is read without
argparse (with gettext, shutil, bz2 and lzma, which its help formatter imports: about
0.5 MB an agent would hold for months); anything else (`--help`, an unknown or
abbreviated option, a bad value) goes to argparse, which answers as the whole command
line does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Final, cast

from greenfed.arguments import (
    LOG_FORMATS,
    LOG_LEVELS,
    add_settings_options,
    mqtt_url,
    positive_float,
    run_command,
    settings_from_options,
)

if TYPE_CHECKING:
    import argparse

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
    from edge.upgrade.versions import DIRECTORY_NAME, is_supervised

    if not args.no_supervisor and not is_supervised():
        from edge.upgrade.supervisor import replace_with_supervisor

        # This process becomes the upgrade supervisor, which runs the agent as its child
        # (`greenfed edge run` again, in the version it chooses): edge/upgrade/supervisor.py.
        versions_dir = settings.agent.resolved_data_dir() / DIRECTORY_NAME
        replace_with_supervisor(versions_dir, args.argv)
    from edge.deferred_imports import defer_imports

    defer_imports()  # before the MQTT client is imported (edge.main)
    from edge.main import run_agent
    from shared.logs import configure_agent_logging
    from shared.runtime import run_main

    configure_agent_logging(settings.log.level, settings.log.format)
    return run_main(lambda stop: run_agent(settings, stop, args.config))


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    def choose(text: str) -> str:
        if text not in choices:
            raise ValueError(text)
        return text

    return choose


# The options add_edge_run_options gives argparse (tests compare the two), by their
# attribute: how a value is converted; None for a flag.
_PLAIN_OPTIONS: Final[dict[str, tuple[str, Callable[[str], object] | None]]] = {
    "--config": ("config", Path),
    "--mqtt-url": ("mqtt_url", mqtt_url),
    "--log-level": ("log_level", _one_of(LOG_LEVELS)),
    "--log-format": ("log_format", _one_of(LOG_FORMATS)),
    "--telemetry-interval": ("telemetry_interval", positive_float),
    "--no-supervisor": ("no_supervisor", None),
}


def parse_plainly(arguments: Sequence[str]) -> dict[str, object] | None:
    """The options of a command line of `_PLAIN_OPTIONS` alone, each given a valid value
    (`--name value` or `--name=value`; the last of a repeated option wins, as in
    argparse); None for anything else, which argparse parses instead."""
    values: dict[str, object] = {
        attribute: (False if convert is None else None)
        for attribute, convert in _PLAIN_OPTIONS.values()
    }
    remaining = list(arguments)
    while remaining:
        name, equals, text = remaining.pop(0).partition("=")
        if name not in _PLAIN_OPTIONS:
            return None
        attribute, convert = _PLAIN_OPTIONS[name]
        if convert is None:
            if equals:
                return None
            values[attribute] = True
            continue
        if not equals:
            if not remaining:
                return None
            text = remaining.pop(0)
        if not text or text.startswith("-"):  # argparse may take it for an option: let it say
            return None
        try:
            values[attribute] = convert(text)
        except Exception:  # argparse parses it again, and names the error
            return None
    return values


def main(argv: Sequence[str]) -> int:
    """`argv`: greenfed's arguments, `edge run` first."""
    if list(argv[:2]) != ["edge", "run"]:
        raise ValueError(f"not an `edge run` command line: {list(argv)}")
    plain = parse_plainly(argv[2:])
    if plain is not None:
        # The attributes argparse would have set: run_command and cmd_edge_run read no more.
        args = cast("argparse.Namespace", SimpleNamespace(**plain, handler=cmd_edge_run))
    else:
        import argparse

        parser = argparse.ArgumentParser(prog="greenfed edge run")
        add_edge_run_options(parser)
        parser.set_defaults(handler=cmd_edge_run)
        args = parser.parse_args(argv[2:])
        del parser  # an agent runs for months
    args.argv = list(argv)  # the upgrade supervisor's child's
    return run_command(args)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
