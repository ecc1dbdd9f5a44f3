"""`greenfed submit/jobs/job/cancel/deployments/deployment/logs/tenants`: the tenant's CLI
(`jobs`/`deployments` with `--tenant`/`--all-tenants` and `tenants create|set`: the admin's).

Only argparse lives here; each command imports the client (`greenfed.api_client`, with
aiohttp) and its tables (`greenfed.work_commands`, with rich) when it runs, like every
other command of `greenfed`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from greenfed.arguments import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    add_confirm_bulk_option,
    non_negative_int,
    positive_float,
    positive_int,
)
from greenfed.output import ACTION_FORMATS, LISTING_FORMATS, add_output_options, output_of

if TYPE_CHECKING:
    from datetime import datetime

    from greenfed.api_client import ApiClient, CliError, Target


def add_client_options(
    parser: argparse.ArgumentParser,
    *,
    formats: tuple[str, ...] | None = LISTING_FORMATS,
    nested: bool = False,
) -> None:
    """--api, --token, --token-file: how a command reaches the control plane; and
    `-o/--output` with `formats` (`--json` the same as `-o json`), unless None.

    `nested`: a sub-command of a command that has them too; its unset options must not
    overwrite what was given before the sub-command's name.
    """
    unset: dict[str, Any] = {"default": argparse.SUPPRESS} if nested else {}
    parser.add_argument(
        "--api",
        help="control plane URL (default $GREENFED_API or http://127.0.0.1:8700)",
        **unset,
    )
    parser.add_argument("--token", help="bearer token (default $GREENFED_TOKEN)", **unset)
    parser.add_argument(
        "--token-file",
        type=Path,
        help="file holding the token (default: the admin token file of this machine, if any)",
        **unset,
    )
    if formats is not None:
        add_output_options(parser, formats, nested=nested)


def client_target(args: argparse.Namespace) -> Target:
    from greenfed.api_client import resolve_target
    from shared.settings import load_settings
    from shared.token_files import admin_token_path

    return resolve_target(
        api=args.api,
        token=args.token,
        token_file=args.token_file,
        default_token_file=lambda: admin_token_path(load_settings(None).store),
    )


def run_client(
    args: argparse.Namespace,
    action: Callable[[ApiClient], Awaitable[int]],
    *,
    timeout_s: float | None = 30.0,
) -> int:
    """Run `action` with a client; a `CliError` is one line on stderr and its exit code,
    also when it ended one of the action's task groups (a watch, a followed log)."""
    from greenfed.api_client import ApiClient, CliError

    async def main() -> int:
        async with ApiClient(client_target(args), timeout_s=timeout_s) as client:
            return await action(client)

    try:
        return asyncio.run(main())
    except CliError as error:
        return _said(error)
    except BaseExceptionGroup as group:
        refusals, others = group.split(CliError)
        if refusals is None or others is not None:
            raise  # something else failed too: not hidden behind a line
        return _said(_first_of(refusals))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _said(error: CliError) -> int:
    print(f"greenfed: {error}", file=sys.stderr)
    return error.exit_code


def _first_of(group: BaseExceptionGroup[CliError]) -> CliError:
    """The first `CliError` of a group of them (which may nest groups)."""
    from greenfed.api_client import CliError

    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    assert isinstance(first, CliError)
    return first


# -- commands ------------------------------------------------------------------


def cmd_submit(args: argparse.Namespace) -> int:
    from greenfed import work_commands
    from greenfed.spec_files import SpecFileError, load_spec_file

    try:
        spec = load_spec_file(args.file, args.kind)
    except SpecFileError as error:
        print(f"greenfed: invalid spec: {error}", file=sys.stderr)
        return EXIT_USAGE
    return run_client(
        args,
        lambda client: work_commands.submit(
            client, spec, idempotency_key=args.idempotency_key, output=output_of(args)
        ),
    )


def _cmd_list(kind: Any) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        from greenfed import work_commands

        return run_client(
            args,
            lambda client: work_commands.list_work(
                client,
                kind,
                state=args.state,
                priority=args.priority,
                limit=args.limit,
                cursor=args.cursor,
                output=output_of(args),
                tenant="*" if args.all_tenants else args.tenant,
            ),
        )

    return command


def _cmd_show(kind: Any) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        from greenfed import work_commands

        return run_client(
            args,
            lambda client: work_commands.show_work(client, kind, args.id, output=output_of(args)),
        )

    return command


def cmd_cancel(args: argparse.Namespace) -> int:
    from greenfed import work_commands

    return run_client(
        args,
        lambda client: work_commands.cancel(
            client, args.id, output=output_of(args), confirm_bulk=args.confirm_bulk
        ),
    )


def cmd_logs(args: argparse.Namespace) -> int:
    """A job's output, or a deployment's replica log (greenfed/replica_logs.py)."""
    from greenfed import replica_logs

    return run_client(
        args,
        lambda client: replica_logs.logs(
            client,
            args.id,
            follow=args.follow,
            tail=args.tail,
            attempt=args.attempt,
            node=args.node,
            replica=args.replica,
        ),
        timeout_s=None if args.follow else 30.0,
    )


def cmd_models(args: argparse.Namespace) -> int:
    from greenfed import work_commands

    if args.models_command == "upload":
        if not args.file.is_file():
            print(f"greenfed: no such file: {args.file}", file=sys.stderr)
            return EXIT_USAGE
        name = args.name or args.file.stem
        return run_client(
            args,
            lambda client: work_commands.upload_model(
                client, args.file, name, output=output_of(args)
            ),
        )
    return run_client(
        args,
        lambda client: work_commands.list_models(
            client, limit=args.limit, cursor=args.cursor, output=output_of(args)
        ),
    )


def cmd_tenants(args: argparse.Namespace) -> int:
    from greenfed import work_commands
    from greenfed.api_client import CliError

    if args.tenants_command is None:
        return run_client(
            args, lambda client: work_commands.list_tenants(client, output=output_of(args))
        )
    try:
        quotas = work_commands.parse_counts("--quota", args.quota, slices=True)
        borrowing = work_commands.parse_counts("--borrow", args.borrow)
        lending = work_commands.parse_counts("--lend", args.lend)
    except CliError as error:
        print(f"greenfed: {error}", file=sys.stderr)
        return EXIT_USAGE
    priorities = tuple(p.strip() for p in args.priorities.split(",")) if args.priorities else None
    if args.tenants_command == "set":
        changes = _tenant_changes(args, quotas, borrowing, priorities)
        if args.lend or args.no_lending_limit:
            changes["lending_limit"] = lending
        return run_client(
            args,
            lambda client: work_commands.set_tenant(
                client, args.name, changes, output=output_of(args)
            ),
        )
    return run_client(
        args,
        lambda client: work_commands.create_tenant(
            client,
            name=args.name,
            quotas=quotas,
            borrowing_limit=borrowing,
            cohort=args.cohort,
            priorities=priorities,
            admin=args.admin,
            output=output_of(args),
            max_running=args.max_running,
            max_queued=args.max_queued,
            lending_limit=lending,
        ),
    )


def _tenant_changes(
    args: argparse.Namespace,
    quotas: dict[str, int],
    borrowing: dict[str, int],
    priorities: tuple[str, ...] | None,
) -> dict[str, object]:
    """What `tenants set` changes: only what was given (`PATCH /v1/tenants/{name}`)."""
    changes: dict[str, object] = {}
    if args.quota or args.no_quotas:
        changes["quotas"] = quotas
    if args.borrow or args.no_borrowing_limit:
        changes["borrowing_limit"] = borrowing
    if args.cohort is not None or args.no_cohort:
        changes["cohort"] = args.cohort
    if priorities:
        changes["allowed_priorities"] = list(priorities)
    for option in ("max_running", "max_queued"):
        value = getattr(args, option)
        if value is not _UNCHANGED:
            changes[option] = value
    return changes


_UNCHANGED: Any = object()


def cap(text: str) -> int | None:
    """A count >= 0, or `unlimited` (no cap)."""
    if text.strip().lower() in ("unlimited", "none"):
        return None
    return non_negative_int(text)


# -- parser ----------------------------------------------------------------------


def cmd_scale(args: argparse.Namespace) -> int:
    from greenfed import work_commands

    return run_client(
        args,
        lambda client: work_commands.scale(client, args.id, args.replicas, output=output_of(args)),
    )


def cmd_rollout(args: argparse.Namespace) -> int:
    from greenfed import work_commands

    return run_client(
        args,
        lambda client: work_commands.end_rollout(
            client, args.id, args.action, output=output_of(args)
        ),
    )


def cmd_load(args: argparse.Namespace) -> int:
    from greenfed import load_commands

    try:
        curve = load_commands.parse_curve(args.qps, args.duration, args.period)
    except ValueError as error:
        print(f"greenfed: {error}", file=sys.stderr)
        return EXIT_USAGE
    return run_client(
        args,
        lambda client: load_commands.drive_load(client, args.deployment, curve, args.duration),
        timeout_s=None,
    )


def cmd_usage(args: argparse.Namespace) -> int:
    from greenfed import usage_commands

    moments: dict[str, datetime | None] = {}
    for option, given in (("--since", args.since), ("--until", args.until)):
        try:
            moments[option] = usage_commands.parse_when(given) if given else None
        except ValueError as error:
            print(f"greenfed: {option}: {error}", file=sys.stderr)
            return EXIT_USAGE
    request = usage_commands.UsageRequest(
        since=moments["--since"], until=moments["--until"], by=args.by, tenant=args.tenant
    )
    return run_client(args, lambda client: usage_commands.usage(client, request, output_of(args)))


def _list_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", help="comma-separated: pending,scheduled,running,...")
    parser.add_argument("--priority", help="comma-separated: p0,p1,p2")
    parser.add_argument("--limit", type=positive_int, help="page size (default 50)")
    parser.add_argument("--cursor", help="the next page, as printed after a full page")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--tenant", help="the admin: this tenant's work only")
    scope.add_argument(
        "--all-tenants", action="store_true", help="the admin: every tenant's work, by tenant"
    )


def add_work_commands(commands: Any) -> None:
    """Add the tenant's commands to `greenfed`'s subparsers."""
    submit = commands.add_parser(
        "submit", help="submit a training job or deployment from a JSON, TOML or YAML spec file"
    )
    submit.add_argument("file", type=Path, help="spec file: .json, .toml, .yaml or .yml")
    submit.add_argument(
        "--kind",
        choices=["training", "deployment"],
        help="what the file describes (default: its `kind` field)",
    )
    submit.add_argument("--idempotency-key", help="retrying with the same key never submits twice")
    add_client_options(submit, formats=ACTION_FORMATS)
    submit.set_defaults(handler=cmd_submit)

    jobs = commands.add_parser("jobs", help="list your training jobs (the admin: everyone's)")
    _list_options(jobs)
    add_client_options(jobs)
    jobs.set_defaults(handler=_cmd_list("training"))

    job = commands.add_parser("job", help="one training job: state, placement, explanation")
    job.add_argument("id")
    add_client_options(job)
    job.set_defaults(handler=_cmd_show("training"))

    scale = commands.add_parser(
        "scale", help="set a deployment's replicas (an autoscaled one within its bounds)"
    )
    scale.add_argument("id")
    scale.add_argument("replicas", type=positive_int)
    add_client_options(scale, formats=ACTION_FORMATS)
    scale.set_defaults(handler=cmd_scale)

    rollout = commands.add_parser(
        "rollout", help="promote or abort a deployment's canary model rollout now"
    )
    rollout.add_argument("action", choices=["promote", "abort"])
    rollout.add_argument("id")
    add_client_options(rollout, formats=ACTION_FORMATS)
    rollout.set_defaults(handler=cmd_rollout)

    load = commands.add_parser(
        "load", help="send requests to a deployment's endpoints at a rate that follows a curve"
    )
    load.add_argument("--deployment", required=True, metavar="ID")
    load.add_argument(
        "--qps", required=True, metavar="CURVE", help="200, ramp:50-400 or diurnal:500-2000"
    )
    load.add_argument("--duration", type=positive_float, default=60.0, help="seconds (60)")
    load.add_argument("--period", type=positive_float, default=None, help="a diurnal day, seconds")
    add_client_options(load, formats=None)
    load.set_defaults(handler=cmd_load)

    usage = commands.add_parser(
        "usage", help="energy, emissions, cost and emissions avoided, with totals (like sacct)"
    )
    usage.add_argument("--since", help="ISO 8601 time or a time ago (24h, 7d); default: all")
    usage.add_argument("--until", help="ISO 8601 time or a time ago; default: now")
    usage.add_argument(
        "--by",
        default="tenant",
        help="group by a comma-separated list of tenant, zone, job, day (default tenant)",
    )
    usage.add_argument("--tenant", help="the admin: one tenant's usage")
    add_client_options(usage, formats=None)
    # `csv`: the API's CSV, for spreadsheets.
    add_output_options(usage, (*LISTING_FORMATS, "csv"), extra=(("--csv", "csv"),))
    usage.set_defaults(handler=cmd_usage)

    cancel = commands.add_parser("cancel", help="cancel a training job or a deployment")
    cancel.add_argument("id")
    add_confirm_bulk_option(cancel)
    add_client_options(cancel, formats=ACTION_FORMATS)
    cancel.set_defaults(handler=cmd_cancel)

    deployments = commands.add_parser(
        "deployments", help="list your inference deployments (the admin: everyone's)"
    )
    _list_options(deployments)
    add_client_options(deployments)
    deployments.set_defaults(handler=_cmd_list("deployment"))

    deployment = commands.add_parser(
        "deployment", help="one deployment: state, placement, explanation"
    )
    deployment.add_argument("id")
    add_client_options(deployment)
    deployment.set_defaults(handler=_cmd_show("deployment"))

    logs = commands.add_parser(
        "logs",
        help="a training job's recent output, or a deployment's replica log",
        description=(
            "A training job's output; for a deployment, its replicas' log (events, then "
            "each replica as its node reports it)."
        ),
    )
    logs.add_argument("id")
    logs.add_argument(
        "--replica", type=non_negative_int, metavar="N", help="a deployment: this replica only"
    )
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new output")
    logs.add_argument("--tail", type=non_negative_int, metavar="N", help="only the last N lines")
    logs.add_argument("--attempt", type=non_negative_int, help="this attempt (default: latest)")
    logs.add_argument("--node", help="this node's worker only")
    add_client_options(logs, formats=None)
    logs.set_defaults(handler=cmd_logs)

    models = commands.add_parser("models", help="list your ONNX models, or upload one")
    models.add_argument("--limit", type=positive_int, default=50)
    models.add_argument("--cursor")
    add_client_options(models)
    models.set_defaults(handler=cmd_models, models_command=None)
    model_commands = models.add_subparsers(dest="models_command", metavar="COMMAND")
    upload = model_commands.add_parser("upload", help="upload an .onnx file; prints its id")
    upload.add_argument("file", type=Path)
    upload.add_argument("--name", help="the model's name (default: the file's name)")
    add_client_options(upload, formats=ACTION_FORMATS, nested=True)

    tenants = commands.add_parser("tenants", help="list tenants, or create one (admin token)")
    add_client_options(tenants)
    tenants.set_defaults(handler=cmd_tenants, tenants_command=None)
    tenant_commands = tenants.add_subparsers(dest="tenants_command", metavar="COMMAND")
    create = tenant_commands.add_parser("create", help="create a tenant; prints its token once")
    create.add_argument("name")
    create.add_argument(
        "--quota",
        action="append",
        default=[],
        metavar="KIND=N",
        help="nominal quota, e.g. --quota gpu=8 or MIG slices --quota mig-1g.10gb=7 (repeatable)",
    )
    create.add_argument(
        "--borrow",
        action="append",
        default=[],
        metavar="KIND=N",
        help="borrowing limit within the cohort, e.g. --borrow gpu=4 (repeatable)",
    )
    create.add_argument(
        "--lend",
        action="append",
        default=[],
        metavar="KIND=N",
        help="lending limit: at most N of its idle quota to its cohort, e.g. --lend gpu=2",
    )
    create.add_argument("--cohort", help="tenants of a cohort lend each other idle quota")
    create.add_argument("--priorities", help="allowed priority classes, e.g. p1,p2 (default all)")
    create.add_argument("--admin", action="store_true", help="an admin tenant")
    _cap_options(create, default=None)
    add_client_options(create, formats=ACTION_FORMATS, nested=True)
    create.set_defaults(handler=cmd_tenants)

    change = tenant_commands.add_parser(
        "set", help="change a tenant's quotas, caps, cohort or priorities (the next pass applies)"
    )
    change.add_argument("name")
    change.add_argument(
        "--quota", action="append", default=[], metavar="KIND=N", help="replaces its quotas"
    )
    change.add_argument("--no-quotas", action="store_true", help="no accelerator quotas")
    change.add_argument(
        "--borrow", action="append", default=[], metavar="KIND=N", help="replaces its limits"
    )
    change.add_argument(
        "--no-borrowing-limit", action="store_true", help="borrow whatever the cohort has idle"
    )
    change.add_argument(
        "--lend", action="append", default=[], metavar="KIND=N", help="replaces its lending limits"
    )
    change.add_argument(
        "--no-lending-limit", action="store_true", help="lend all its idle quota to its cohort"
    )
    cohort = change.add_mutually_exclusive_group()
    cohort.add_argument("--cohort", help="join this cohort")
    cohort.add_argument("--no-cohort", action="store_true", help="leave its cohort")
    change.add_argument("--priorities", help="allowed priority classes, e.g. p1,p2")
    _cap_options(change, default=_UNCHANGED)
    add_client_options(change, formats=ACTION_FORMATS, nested=True)
    change.set_defaults(handler=cmd_tenants)


def _cap_options(parser: argparse.ArgumentParser, *, default: Any) -> None:
    parser.add_argument(
        "--max-running",
        type=cap,
        default=default,
        metavar="N",
        help="at most N of its jobs and deployments placed at once, or unlimited",
    )
    parser.add_argument(
        "--max-queued",
        type=cap,
        default=default,
        metavar="N",
        help="at most N pending; a submission beyond is refused (429), or unlimited",
    )
