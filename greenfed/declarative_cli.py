"""`greenfed apply -f`, `greenfed diff -f`, `greenfed events`, and the options they add
to other commands: `submit --dry-run`, `--watch` on `jobs`, `job`, `deployments` and
`nodes`.

Only argparse lives here; each command imports the client and what it prints when it
runs (greenfed/declarative_commands.py, greenfed/watch.py), like every other command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from greenfed.arguments import EXIT_USAGE
from greenfed.output import ACTION_FORMATS, output_of
from greenfed.work_cli import add_client_options, run_client


def _cmd_apply(*, diff: bool) -> Any:
    def command(args: argparse.Namespace) -> int:
        from greenfed import declarative_commands
        from greenfed.spec_files import SpecFileError

        try:
            specs = declarative_commands.load_specs(args.file, args.kind)
        except SpecFileError as error:
            print(f"greenfed: invalid spec: {error}", file=sys.stderr)
            return EXIT_USAGE
        return run_client(
            args,
            lambda client: declarative_commands.apply(
                client,
                specs,
                dry_run=diff or args.dry_run,
                output=output_of(args),
                diff=diff,
            ),
        )

    return command


def _cmd_events(args: argparse.Namespace) -> int:
    from greenfed import declarative_commands
    from greenfed.usage_commands import parse_when

    try:
        since = parse_when(args.since) if args.since else None
    except ValueError as error:
        print(f"greenfed: --since: {error}", file=sys.stderr)
        return EXIT_USAGE
    from greenfed.event_stream import EVENT_FAMILIES, EVENT_KINDS

    kinds = tuple(k.strip() for given in args.kind or () for k in given.split(",") if k.strip())
    unknown = [kind for kind in kinds if kind not in (*EVENT_KINDS, *EVENT_FAMILIES)]
    if unknown:
        known = ", ".join((*EVENT_KINDS, *EVENT_FAMILIES))
        print(
            f"greenfed: --kind: no event is of kind {unknown[0]!r}; the kinds are {known}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return run_client(
        args,
        lambda client: declarative_commands.events(
            client, follow=args.follow, kinds=kinds, since=since, output=output_of(args)
        ),
        timeout_s=None if args.follow else 30.0,
    )


def _with_dry_run(submit: argparse.ArgumentParser) -> None:
    """`greenfed submit FILE --dry-run`: the server checks it and says where it would go."""
    submit_once = submit.get_default("handler")
    submit.add_argument(
        "--dry-run",
        action="store_true",
        help="check it and say where it would be placed now; submit nothing",
    )

    def command(args: argparse.Namespace) -> int:
        if not args.dry_run:
            return int(submit_once(args))
        from greenfed import declarative_commands
        from greenfed.spec_files import SpecFileError, load_spec_file

        try:
            spec = load_spec_file(args.file, args.kind)
        except SpecFileError as error:
            print(f"greenfed: invalid spec: {error}", file=sys.stderr)
            return EXIT_USAGE
        return run_client(
            args, lambda client: declarative_commands.dry_run(client, spec, output=output_of(args))
        )

    submit.set_defaults(handler=command)


def add_declarative_commands(commands: Any) -> None:
    """Add apply, diff and events to `greenfed`'s subparsers, and `--dry-run` and
    `--watch` to the commands already there (call after those are added)."""
    from greenfed.watch import add_watch, work_ended

    for name, helped in (
        ("apply", "create or update work by name from spec files (deployments change in place)"),
        ("diff", "what apply would change, per object, changing nothing"),
    ):
        parser = commands.add_parser(name, help=helped)
        parser.add_argument(
            "-f",
            "--file",
            type=Path,
            action="append",
            required=True,
            metavar="FILE|DIR",
            help="a spec file, or a directory of them (.json, .toml, .yaml, .yml); repeatable",
        )
        parser.add_argument(
            "--kind",
            choices=["training", "deployment"],
            help="what the files describe (default: each file's `kind` field)",
        )
        if name == "apply":
            parser.add_argument(
                "--dry-run",
                action="store_true",
                help="say what would be created or changed (and where new work would go); "
                "change nothing",
            )
        add_client_options(parser, formats=ACTION_FORMATS)
        parser.set_defaults(handler=_cmd_apply(diff=name == "diff"))

    events = commands.add_parser("events", help="the events of your work (the admin: everyone's)")
    events.add_argument("-f", "--follow", action="store_true", help="then print each new one")
    events.add_argument(
        "--kind",
        action="append",
        metavar="KIND",
        help="only these kinds, comma-separated or repeated (work.state; work: every work.*)",
    )
    events.add_argument("--since", help="ISO 8601 time or a time ago (30m, 24h, 7d)")
    # A stream of lines: no `wide` table to widen.
    add_client_options(events, formats=("table", "json", "yaml"))
    events.set_defaults(handler=_cmd_events)

    _with_dry_run(commands.choices["submit"])
    add_watch(commands.choices["jobs"])
    add_watch(commands.choices["deployments"])
    add_watch(commands.choices["job"], ended=work_ended("jobs"))
    add_watch(commands.choices["deployment"], ended=work_ended("deployments"))
    add_watch(commands.choices["nodes"], events=False)
