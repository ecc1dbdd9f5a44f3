"""`greenfed hold|release|suspend|resume|requeue ID` and `greenfed patch ID --...`: job
control (cloud/api/job_control.py), as Slurm's `scontrol hold/release/requeue`.

Only argparse lives here; a command imports the client and the views when it runs, like
every other command of `greenfed`. A refusal (a running job cannot be held, a job that
does not checkpoint cannot be suspended, a started job cannot change) is the API's
problem detail on one line and exit status 1; an invalid value exit status 2, a priority
class the tenant may not use 3 (docs/cli.md "Exit status and messages").
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, Final

from greenfed.arguments import EXIT_USAGE, non_negative_int, positive_float, positive_int
from greenfed.output import ACTION_FORMATS, output_of
from greenfed.work_cli import add_client_options, run_client

if TYPE_CHECKING:
    from greenfed.api_client import ApiClient
    from greenfed.output import Output

# action -> (help, what the one-line answer says it did)
ACTIONS: Final = {
    "hold": ("keep a pending job out of the queue until released", "held"),
    "release": ("queue a held job again", "released"),
    "suspend": (
        "stop a running job that saves checkpoints (or keep a pending one from starting) "
        "until resumed",
        "suspended",
    ),
    "resume": ("queue a suspended job again; it continues from its newest checkpoint", "resumed"),
    "requeue": ("stop a scheduled or running job and queue it again", "requeued"),
}
# `greenfed patch` options -> the PATCH body's fields
_PATCH_FIELDS: Final = (
    ("priority", "priority"),
    ("workers", "workers"),
    ("gpus", "accelerators_per_worker"),
    ("accelerator_kind", "accelerator_kind"),
    ("memory_gib", "memory_gib"),
    ("host_memory_gib", "host_memory_gib"),
    ("cpus_per_worker", "cpus_per_worker"),
    ("duration", "estimated_duration_s"),
    ("deadline", "deadline"),
    ("window", "start_window"),
)
_CLEAR: Final = "none"  # `--deadline none`, `--window none`: drop it


async def control(client: ApiClient, job_id: str, action: str, *, output: Output) -> int:
    from cloud.work.views import JobView
    from greenfed.api_client import path_segment
    from greenfed.arguments import EXIT_OK
    from greenfed.output import emit
    from shared.printable import printable

    reply = await client.ask("POST", f"/v1/jobs/{path_segment(job_id)}/{action}", JobView)

    def said() -> None:
        job = reply.value
        state = f"{job.state} ({job.hold})" if job.hold else job.state
        reason = f": {printable(job.reason)}" if job.reason else ""
        output.out.write(f"job {job.id} {ACTIONS[action][1]}, now {state}{reason}\n")

    emit(output, reply.payload, said)
    return EXIT_OK


def patch_body(args: argparse.Namespace) -> dict[str, object]:
    body: dict[str, object] = {}
    for option, field in _PATCH_FIELDS:
        value = getattr(args, option)
        if value is None:
            continue
        body[field] = None if value == _CLEAR and field in ("deadline", "start_window") else value
    return body


async def patch(client: ApiClient, job_id: str, body: dict[str, object], *, output: Output) -> int:
    import msgspec

    from cloud.work.views import JobView
    from greenfed.api_client import path_segment
    from greenfed.arguments import EXIT_OK
    from greenfed.output import emit

    # A value the API refuses (422, naming the field) is a usage error, as for every
    # command (greenfed/api_client.py).
    reply = await client.ask(
        "PATCH", f"/v1/jobs/{path_segment(job_id)}", JobView, body=msgspec.json.encode(body)
    )

    def said() -> None:
        job = reply.value
        changed = ", ".join(sorted(body))
        output.out.write(f"job {job.id} changed ({changed}), version {job.version}\n")

    emit(output, reply.payload, said)
    return EXIT_OK


def _cmd_control(action: str) -> Any:
    def command(args: argparse.Namespace) -> int:
        return run_client(
            args, lambda client: control(client, args.id, action, output=output_of(args))
        )

    return command


def cmd_patch(args: argparse.Namespace) -> int:
    body = patch_body(args)
    if not body:
        names = ", ".join("--" + option.replace("_", "-") for option, _ in _PATCH_FIELDS)
        print(f"greenfed: nothing to change: give at least one of {names}", file=sys.stderr)
        return EXIT_USAGE
    return run_client(args, lambda client: patch(client, args.id, body, output=output_of(args)))


def add_job_control_commands(commands: Any) -> None:
    """Add hold, release, suspend, resume, requeue and patch to `greenfed`'s subparsers."""
    for action, (help_text, _) in ACTIONS.items():
        parser = commands.add_parser(action, help=help_text)
        parser.add_argument("id", help="the job's id")
        add_client_options(parser, formats=ACTION_FORMATS)
        parser.set_defaults(handler=_cmd_control(action))

    patch_parser = commands.add_parser(
        "patch", help="change a queued job: priority, resources, deadline, start window"
    )
    patch_parser.add_argument("id", help="the job's id (pending, never placed)")
    patch_parser.add_argument("--priority", choices=["p0", "p1", "p2"])
    patch_parser.add_argument("--workers", type=positive_int, help="gang size")
    patch_parser.add_argument(
        "--gpus", type=positive_int, metavar="N", help="accelerators per worker"
    )
    patch_parser.add_argument("--accelerator-kind", choices=["gpu", "npu", "cpu"])
    patch_parser.add_argument("--memory-gib", type=positive_float, help="per accelerator")
    patch_parser.add_argument("--host-memory-gib", type=positive_float, help="per worker")
    patch_parser.add_argument("--cpus-per-worker", type=non_negative_int)
    patch_parser.add_argument(
        "--duration", type=positive_float, metavar="S", help="estimated_duration_s"
    )
    patch_parser.add_argument(
        "--deadline", metavar="TIME", help="RFC 3339, e.g. 2026-12-01T00:00:00Z; none drops it"
    )
    patch_parser.add_argument(
        "--window", metavar="HH:MM-HH:MM", help="start window (node-local time); none drops it"
    )
    add_client_options(patch_parser, formats=ACTION_FORMATS)
    patch_parser.set_defaults(handler=cmd_patch)
