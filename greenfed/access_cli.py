"""`greenfed tokens list|create|rotate|revoke` and `greenfed audit`: argparse only; the
commands import their client and tables (`greenfed.access_commands`) when they run."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from greenfed.arguments import EXIT_USAGE, positive_int
from greenfed.output import ACTION_FORMATS, output_of
from greenfed.work_cli import add_client_options, run_client

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def overlap_s(text: str) -> float:
    """`0`, `90`, `90s`, `30m`, `1h`, `2d`: seconds (0: the old token is refused at once)."""
    number, unit = (text[:-1], text[-1]) if text and text[-1] in _UNITS else (text, "s")
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (0, 90s, 30m, 1h)") from None
    if not 0 <= value <= 30 * 86400:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 30 days")
    return value


def cmd_tokens(args: argparse.Namespace) -> int:
    from greenfed import access_commands

    output = output_of(args)
    command = args.tokens_command or "list"
    if command == "create":
        return run_client(
            args,
            lambda client: access_commands.create_token(
                client, args.name, tenant=args.tenant, output=output
            ),
        )
    if command == "rotate":
        return run_client(
            args,
            lambda client: access_commands.rotate_token(
                client, args.token_id, overlap_s=args.overlap, output=output
            ),
        )
    if command == "revoke":
        return run_client(
            args, lambda client: access_commands.revoke_token(client, args.token_id, output=output)
        )
    tenant = "*" if getattr(args, "all_tenants", False) else getattr(args, "tenant", None)
    return run_client(
        args, lambda client: access_commands.list_tokens(client, tenant=tenant, output=output)
    )


def cmd_audit(args: argparse.Namespace) -> int:
    from greenfed import access_commands
    from greenfed.usage_commands import parse_when

    try:
        since = parse_when(args.since) if args.since else None
    except ValueError as error:
        print(f"greenfed: --since: {error}", file=sys.stderr)
        return EXIT_USAGE
    return run_client(
        args,
        lambda client: access_commands.list_audit(
            client,
            since=since,
            actor=args.actor,
            action=args.action,
            limit=args.limit,
            cursor=args.cursor,
            output=output_of(args),
        ),
    )


def add_access_commands(commands: Any) -> None:
    """Add `tokens` and `audit` to `greenfed`'s subparsers."""
    tokens = commands.add_parser(
        "tokens", help="your bearer tokens: list, create, rotate, revoke (the admin: anyone's)"
    )
    add_client_options(tokens)
    tokens.set_defaults(handler=cmd_tokens, tokens_command=None)
    token_commands = tokens.add_subparsers(dest="tokens_command", metavar="COMMAND")

    listing = token_commands.add_parser("list", help="tokens without their secrets")
    scope = listing.add_mutually_exclusive_group()
    scope.add_argument("--tenant", help="the admin: this tenant's tokens")
    scope.add_argument("--all-tenants", action="store_true", help="the admin: every tenant's")
    add_client_options(listing, nested=True)

    create = token_commands.add_parser("create", help="another token; prints it once")
    create.add_argument("name", help="a label: ci, laptop, ...")
    create.add_argument("--tenant", help="the admin: a token of this tenant")
    add_client_options(create, formats=ACTION_FORMATS, nested=True)

    rotate = token_commands.add_parser(
        "rotate", help="a new token in place of one; the old one works for --overlap more"
    )
    rotate.add_argument("token_id", metavar="ID")
    rotate.add_argument(
        "--overlap",
        type=overlap_s,
        metavar="DURATION",
        help="how long the old token keeps working: 0, 90s, 30m, 1h (default 1h)",
    )
    add_client_options(rotate, formats=ACTION_FORMATS, nested=True)

    revoke = token_commands.add_parser("revoke", help="refuse a token from now on")
    revoke.add_argument("token_id", metavar="ID")
    add_client_options(revoke, formats=ACTION_FORMATS, nested=True)

    audit = commands.add_parser(
        "audit", help="the audit log of admin actions, newest first (admin)"
    )
    audit.add_argument("--since", help="ISO 8601 time or a time ago (24h, 7d)")
    audit.add_argument("--actor", help="by this tenant (name)")
    audit.add_argument("--action", help="comma-separated, e.g. token.revoke,work.cancel")
    audit.add_argument("--limit", type=positive_int, help="page size (default 50)")
    audit.add_argument("--cursor", help="the next page, as printed after a full page")
    add_client_options(audit)
    audit.set_defaults(handler=cmd_audit)
