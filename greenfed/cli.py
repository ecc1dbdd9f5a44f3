"""The `greenfed` command line.

Each command imports its implementation only when it runs, so `greenfed edge ...`
works on a device that installed only the `edge` extra (no database stack, no
numpy, no web server libraries beyond what the agent needs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from greenfed import cluster_arguments
from greenfed.access_cli import add_access_commands
from greenfed.arguments import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    accelerator_counts_argument,
    add_confirm_bulk_option,
    add_settings_options,
    non_negative_int,
    port,
    positive_float,
    positive_int,
    run_command,
    settings_from_options,
    size_bytes_argument,
)
from greenfed.data_dir_lock import data_dir_lock
from greenfed.declarative_cli import add_declarative_commands
from greenfed.edge_run import EDGE_RUN_HELP, add_edge_run_options, cmd_edge_run
from greenfed.job_control_cli import add_job_control_commands
from greenfed.output import ACTION_FORMATS, emit, output_of
from greenfed.ports import check_api_port
from greenfed.store_cli import add_store_commands
from greenfed.upgrade_cli import add_upgrade_commands
from greenfed.work_cli import add_client_options, add_work_commands, run_client
from shared.build import version_text
from shared.settings import ConfigError, Settings

if TYPE_CHECKING:
    from sim_devices.runner import Shard


def _add_api_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-host", help="address the REST API listens on")
    parser.add_argument("--api-port", type=port, help="REST API port (default 8700)")


def _configure_logging(settings: Settings) -> None:
    from shared.logs import configure_logging

    configure_logging(settings.log.level, settings.log.format)


def _check_tls_files(settings: Settings) -> None:
    """A missing or broken mqtt.tls_* file is one configuration error line (exit 2)
    before the app starts, not a traceback from each of its MQTT clients."""
    from shared.mqtt import check_tls_files

    check_tls_files(settings.mqtt)


# -- commands ------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    # People watch `greenfed up` in a terminal: the summary lines, not every agent's log.
    # Its simulated fleet reports to its own control plane, held to that one's limits.
    settings = settings_from_options(
        args,
        default_log_level=None if args.log_level else "warning",
        fleet_reports_here=True,
    )
    _configure_logging(settings)
    _check_tls_files(settings)
    # Refused at once, before the control plane's imports take their seconds.
    with data_dir_lock(settings.store.resolved_data_dir(), "up"):
        check_api_port(settings.cloud.api_host, settings.cloud.api_port)
        from greenfed.up import UpOptions, external_mqtt_url, run_up
        from shared.runtime import run_main

        options = UpOptions(
            sim_nodes=args.sim,
            fleet_file=args.fleet,
            # mqtt.url set anywhere (file, environment, flag) names the broker to use.
            external_mqtt_url=external_mqtt_url(
                settings, config_file=args.config, mqtt_url_option=args.mqtt_url
            ),
            broker_port=args.broker_port,
        )
        return run_main(lambda stop: run_up(settings, options, stop))


def cmd_cloud(args: argparse.Namespace) -> int:
    settings = settings_from_options(args)
    _configure_logging(settings)
    _check_tls_files(settings)
    # Replicas may share a data directory; a `greenfed up` on it may not (and v.v.).
    with data_dir_lock(settings.store.resolved_data_dir(), "cloud", exclusive=False):
        check_api_port(settings.cloud.api_host, settings.cloud.api_port)
        from cloud.main import run_cloud
        from shared.runtime import run_main

        return run_main(lambda stop: run_cloud(settings, stop))


def cmd_edge_doctor(args: argparse.Namespace) -> int:
    import asyncio

    from edge.doctor import enrolled_api_url, print_checks, run_checks
    from greenfed.enrol_cli import default_config_path

    config = args.config or default_config_path()
    args.config = config if config.exists() else args.config
    settings = settings_from_options(args, default_log_level=None if args.log_level else "error")
    _configure_logging(settings)
    checks = asyncio.run(run_checks(settings, enrolled_api_url(args.config), args.config))
    return print_checks(checks)


def cmd_edge_discover(args: argparse.Namespace) -> int:
    from edge.main import print_discovery

    settings = settings_from_options(args, default_log_level=None if args.log_level else "warning")
    _configure_logging(settings)
    return print_discovery(settings, args.json)


def cmd_sim(args: argparse.Namespace) -> int:
    from shared.runtime import run_main
    from sim_devices.fleet import load_sized_fleet
    from sim_devices.main import run_sim
    from sim_devices.processes import run_sim_processes

    settings = settings_from_options(args, default_log_level=None if args.log_level else "warning")
    _configure_logging(settings)
    fleet = load_sized_fleet(args.fleet, args.sim)
    # At most one process per node: one without a node of its own would have nothing
    # to run and end at once, and a child that ends stops the whole fleet.
    processes = max(1, min(args.processes, fleet.node_count))
    if args.shard is None and processes > 1:
        return run_main(
            lambda stop: run_sim_processes(args.argv, processes, stop, args.connect_rate)
        )
    return run_main(
        lambda stop: run_sim(
            settings, fleet, stop, connects_per_s=args.connect_rate, shard=args.shard
        )
    )


def _shard(text: str) -> Shard:
    from sim_devices.runner import Shard

    index, _, count = text.partition("/")
    try:
        return Shard(int(index), int(count))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: must be I/N with 0 <= I < N") from None


def cmd_nodes(args: argparse.Namespace) -> int:
    from greenfed.api_client import ApiClient
    from greenfed.nodes_cli import fetch_nodes, render_table

    params = {
        key: value
        for key in ("site", "zone", "kind", "state", "approval")
        if (value := getattr(args, key)) is not None
    }

    output = output_of(args)

    async def show(client: ApiClient) -> int:
        nodes = await fetch_nodes(client, params)
        emit(output, nodes, lambda: render_table(nodes, output.out, wide=output.wide))
        return EXIT_OK

    return run_client(args, show, timeout_s=10.0)


def _join_token_body(args: argparse.Namespace) -> Any:
    from cloud.fleet.enrolment_views import JoinTokenCreate

    return JoinTokenCreate(
        ttl_s=args.ttl,
        uses=args.uses,
        site=args.site,
        zone=args.zone,
        region=args.region,
        labels=args.labels or {},
        work=args.work,
        max_accelerators=args.max_accelerators or {},
        accelerator_models=tuple(args.model or ()),
        max_accelerator_memory_bytes=args.max_memory,
    )


def cmd_join_token_create(args: argparse.Namespace) -> int:
    from greenfed import nodes_cli

    body = _join_token_body(args)
    return run_client(
        args, lambda client: nodes_cli.create_join_token(client, body, output=output_of(args))
    )


def cmd_join_token_list(args: argparse.Namespace) -> int:
    from greenfed import nodes_cli

    return run_client(
        args, lambda client: nodes_cli.list_join_tokens(client, output=output_of(args))
    )


def cmd_join_token_revoke(args: argparse.Namespace) -> int:
    from greenfed import nodes_cli

    return run_client(
        args,
        lambda client: nodes_cli.revoke_join_token(client, args.token_id, output=output_of(args)),
    )


def cmd_nodes_revoke(args: argparse.Namespace) -> int:
    from greenfed import nodes_cli

    return run_client(
        args,
        lambda client: nodes_cli.revoke_node(
            client, args.node_id, output=output_of(args), confirm_bulk=args.confirm_bulk
        ),
    )


def cmd_nodes_admin(args: argparse.Namespace) -> int:
    from greenfed import nodes_cli

    body: dict[str, object] | None = None
    if args.nodes_command == "set":
        body = {}
        if args.taint is not None:
            body["taints"] = [] if args.taint == [""] else args.taint
        if args.label is not None:
            body["labels"] = dict(item for labels in args.label for item in labels.items())
    return run_client(
        args,
        lambda client: nodes_cli.set_node(
            client,
            args.node_id,
            args.nodes_command,
            body=body,
            output=output_of(args),
            confirm_bulk=getattr(args, "confirm_bulk", False),
        ),
    )


def cmd_nodes_approve(args: argparse.Namespace) -> int:
    from greenfed import nodes_cli

    return run_client(
        args,
        lambda client: nodes_cli.approve_node(
            client, args.node_id, trust_figures=args.trust_figures, output=output_of(args)
        ),
    )


def cmd_nodes_enrolled(args: argparse.Namespace) -> int:
    from greenfed import nodes_cli

    return run_client(args, lambda client: nodes_cli.list_enrolled(client, output=output_of(args)))


def cmd_nodes_unenrolled(args: argparse.Namespace) -> int:
    from greenfed import nodes_cli

    return run_client(
        args, lambda client: nodes_cli.list_unenrolled(client, output=output_of(args))
    )


def cmd_nodes_readmit(args: argparse.Namespace) -> int:
    from greenfed import nodes_cli

    if bool(args.node_ids) == args.all:
        print(
            "greenfed nodes readmit: name the nodes to re-admit, or give --all (not both)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return run_client(
        args,
        lambda client: nodes_cli.readmit_nodes(
            client, args.node_ids, every=args.all, output=output_of(args)
        ),
    )


def cmd_clusters(args: argparse.Namespace) -> int:
    from greenfed import clusters_cli
    from greenfed.api_client import CliError

    command = args.clusters_command
    if command == "add":
        try:
            spec = clusters_cli.spec_of(args)
        except CliError as error:
            print(f"greenfed: {error}", file=sys.stderr)
            return error.exit_code
        return run_client(
            args, lambda client: clusters_cli.add_cluster(client, spec, output=output_of(args))
        )
    if command == "remove":
        return run_client(
            args,
            lambda client: clusters_cli.remove_cluster(client, args.name, output=output_of(args)),
        )
    return run_client(
        args, lambda client: clusters_cli.list_clusters(client, output=output_of(args))
    )


def cmd_mqtt_accounts(args: argparse.Namespace) -> int:
    from greenfed import mqtt_cli

    if args.mqtt_accounts_command == "revoke":
        return run_client(
            args, lambda client: mqtt_cli.revoke_account(client, args.name, output=output_of(args))
        )
    return run_client(
        args,
        lambda client: mqtt_cli.create_account(
            client, args.name, args.role, output=output_of(args)
        ),
    )


def cmd_edge_enrol(args: argparse.Namespace) -> int:
    import asyncio

    from greenfed.api_client import CliError
    from greenfed.enrol_cli import default_config_path, enrol

    try:
        return asyncio.run(
            enrol(
                api=args.api,
                token=args.token,
                config=args.config or default_config_path(),
                node_id=args.node_id,
                ca=args.ca,
            )
        )
    except CliError as error:
        print(f"greenfed: {error}", file=sys.stderr)
        return error.exit_code


def duration_s(text: str) -> float:
    """`90`, `90s`, `30m`, `1h`, `2d`: seconds."""
    import math

    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (90s, 30m, 1h, 2d)") from None
    # float() reads "inf" (and "1e400" as inf), which JSON would carry as null: the
    # default lifetime, not the one asked for.
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite duration")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def labels_argument(text: str) -> dict[str, str]:
    """`k=v,k2=v2`."""
    labels: dict[str, str] = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"{pair!r} is not key=value")
        labels[key] = value
    return labels


def cmd_schema(args: argparse.Namespace) -> int:
    from shared.schemas import payload_schema, schema_catalog
    from shared.topics import Channel, Topics

    if args.channel:
        document: object = payload_schema(Channel(args.channel))
    else:
        document = schema_catalog(Topics(args.topic_root))
    print(json.dumps(document, indent=2))
    return EXIT_OK


def cmd_bench_scheduler(args: argparse.Namespace) -> int:
    from cloud.eval.scheduler_bench import main as bench_main

    argv = ["--nodes", str(args.nodes), "--jobs", str(args.jobs), "--seed", str(args.seed)]
    argv += ["--json"] * args.json + ["--sweep"] * args.sweep
    return bench_main(argv)


def cmd_eval(args: argparse.Namespace) -> int:
    from cloud.eval.bound import BoundUnavailable
    from cloud.eval.report import as_json, describe, optimum_line, plot, table
    from cloud.eval.runner import EvalOptions, build_scenario, run_eval
    from cloud.eval.simulation import HookFailedInEvaluation
    from cloud.eval.workload import dump_workload

    try:
        options = EvalOptions(
            start=args.start,
            days=args.days,
            policies=tuple(args.policies),
            seed=args.seed,
            fleet=args.fleet,
            workload=args.workload,
            carbon_dir=args.carbon_dir,
            forecaster=args.forecaster,
            perfect_forecast=args.perfect_forecast,
            target_load=args.load,
            generator=args.generator,
            migration=args.migration,
            power_capping=args.power_capping,
            room_making=args.room_making,
            allow_missing_zones=args.allow_missing_zones,
            bound=args.optimum,
            **({} if args.patience is None else {"patience_s": args.patience}),
            **({} if args.min_saving is None else {"min_saving": args.min_saving}),
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if args.plot is not None:
        from cloud.eval.report import pyplot

        pyplot()  # fail before the simulation, not after it
    try:
        scenario = build_scenario(options)
    except ValueError as error:  # e.g. a bad carbon directory
        raise ConfigError(str(error)) from None
    if args.dump_workload is not None:
        args.dump_workload.write_text(dump_workload(scenario.workload), encoding="utf-8")
    try:
        report = run_eval(options, scenario=scenario)
    except HookFailedInEvaluation as error:
        print(f"greenfed: the evaluation stopped: {error}", file=sys.stderr)
        return EXIT_FAILURE
    except BoundUnavailable as error:
        # The policies' figures without the bound they are measured against would pass
        # for a complete result: nothing is printed but why.
        print(
            f"greenfed: the offline optimum is unavailable: {error} "
            "(--no-optimum evaluates the policies without it)",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    if args.json:
        print(as_json(report.results, report.bound, report.inference_bound))
    else:
        print(describe(report))
        print(table(report.results, report.bound, report.inference_bound))
        if report.bound is not None and report.inference_bound is not None:
            print(optimum_line(report.results, report.bound, report.inference_bound))
    if args.plot is not None:
        plot(report, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    return EXIT_OK


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (YYYY-MM-DD)") from None


def _policy_list(text: str) -> list[str]:
    from cloud.green.policies import POLICY_NAMES

    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in POLICY_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown) or '(none)'}; known: {', '.join(POLICY_NAMES)}"
        )
    return names


class _VersionAction(argparse.Action):
    """`--version`, asking git for the commit only when it is asked for (every command
    builds this parser)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(version_text())
        parser.exit()


def cmd_version(args: argparse.Namespace) -> int:
    print(version_text())
    return EXIT_OK


def cmd_completion(args: argparse.Namespace) -> int:
    from greenfed.completion import completion_script

    sys.stdout.write(completion_script(build_parser(), args.shell))
    return EXIT_OK


# -- parser ----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="greenfed",
        description=(
            "Edge–cloud federated scheduler for AI work that weighs carbon, price and latency."
        ),
    )
    parser.add_argument(
        "--version", action=_VersionAction, nargs=0, help="print the version and exit"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = commands.add_parser("up", help="embedded broker + control plane + simulated fleet")
    add_settings_options(up)
    _add_api_options(up)
    up.add_argument(
        "--sim",
        type=non_negative_int,
        metavar="N",
        help="scale the simulated fleet to N nodes (default: the fleet file's 40)",
    )
    up.add_argument("--fleet", type=Path, help="fleet file (default: the built-in fleet)")
    up.add_argument(
        "--broker-port",
        type=port,
        help="embedded broker port (default 1883, or a free one if taken)",
    )
    up.add_argument("--telemetry-interval", type=positive_float, metavar="SECONDS")
    up.set_defaults(handler=cmd_up)

    cloud = commands.add_parser("cloud", help="run the control plane")
    add_settings_options(cloud)
    _add_api_options(cloud)
    cloud.set_defaults(handler=cmd_cloud)

    edge = commands.add_parser("edge", help="the edge agent")
    edge_commands = edge.add_subparsers(dest="edge_command", required=True, metavar="COMMAND")
    edge_run = edge_commands.add_parser("run", help=EDGE_RUN_HELP)
    add_edge_run_options(edge_run)
    edge_run.set_defaults(handler=cmd_edge_run)
    discover = edge_commands.add_parser("discover", help="list this machine's accelerators")
    add_settings_options(discover, mqtt=False)
    discover.add_argument("--json", action="store_true", help="machine-readable output")
    discover.set_defaults(handler=cmd_edge_discover)
    edge_enrol = edge_commands.add_parser(
        "enrol", help="trade a join token for this node's credentials (writes its settings)"
    )
    edge_enrol.add_argument("--api", required=True, help="the control plane's URL")
    edge_enrol.add_argument(
        "--token", required=True, help="a join token (greenfed nodes join-token create)"
    )
    edge_enrol.add_argument("--ca", type=Path, help="CA certificate (PEM) to verify an https API")
    edge_enrol.add_argument(
        "--config", type=Path, help="settings file to write (default ~/.config/greenfed/agent.toml)"
    )
    edge_enrol.add_argument(
        "--node-id", help="this node's id (default: the file's, else the host name)"
    )
    edge_enrol.set_defaults(handler=cmd_edge_enrol)
    doctor = edge_commands.add_parser(
        "doctor",
        help="check what a failed install usually is: broker, key, drivers, disk, clock",
    )
    add_settings_options(doctor)
    doctor.set_defaults(handler=cmd_edge_doctor)

    sim = commands.add_parser("sim", help="run a simulated fleet of real agents")
    add_settings_options(sim)
    sim.add_argument("--fleet", type=Path, help="fleet file (default: the built-in fleet)")
    sim.add_argument("--sim", type=non_negative_int, metavar="N", help="scale the fleet to N nodes")
    sim.add_argument("--telemetry-interval", type=positive_float, metavar="SECONDS")
    sim.add_argument(
        "--connect-rate",
        type=positive_float,
        default=200.0,
        metavar="PER_S",
        help="new MQTT connections per second while starting, all processes together (default 200)",
    )
    sim.add_argument(
        "--processes",
        type=positive_int,
        default=1,
        metavar="N",
        help="split the fleet over N processes, each with its own event loop (default 1; "
        "one process carries a few thousand agents; never more processes than nodes)",
    )
    # One process's share of a split fleet (what --processes starts).
    sim.add_argument("--shard", type=_shard, metavar="I/N", help=argparse.SUPPRESS)
    sim.set_defaults(handler=cmd_sim)

    nodes = commands.add_parser("nodes", help="show the fleet from a running control plane")
    add_client_options(nodes)
    nodes.add_argument("--site", choices=["cloud", "edge"])
    nodes.add_argument("--zone")
    nodes.add_argument("--kind", choices=["gpu", "npu", "cpu"])
    nodes.add_argument("--state", choices=["online", "offline"])
    nodes.add_argument(
        "--approval",
        choices=["approved", "pending-approval"],
        help="pending-approval: nodes that say more than they enrolled as",
    )
    nodes.set_defaults(handler=cmd_nodes)
    nodes_commands = nodes.add_subparsers(dest="nodes_command", metavar="COMMAND")
    join_token = nodes_commands.add_parser("join-token", help="join tokens for new nodes (admin)")
    join_token_commands = join_token.add_subparsers(
        dest="join_token_command", required=True, metavar="COMMAND"
    )
    token_create = join_token_commands.add_parser("create", help="a new join token, shown once")
    add_client_options(token_create, formats=ACTION_FORMATS, nested=True)
    token_create.add_argument(
        "--ttl", type=duration_s, help="lifetime: 90s, 30m, 1h, 2d (default cloud.join_token_ttl_s)"
    )
    token_create.add_argument(
        "--uses", type=positive_int, default=1, help="nodes it may enrol (default 1)"
    )
    token_create.add_argument("--site", choices=["cloud", "edge"], default=None)
    token_create.add_argument("--zone", default=None)
    token_create.add_argument("--region", default=None)
    token_create.add_argument("--labels", type=labels_argument, metavar="K=V,...", default=None)
    token_create.add_argument(
        "--work",
        choices=["training", "inference", "any"],
        default="any",
        help="the work its nodes may run (default any)",
    )
    token_create.add_argument(
        "--max-accelerators",
        type=accelerator_counts_argument,
        metavar="KIND=N,...",
        default=None,
        help="at most N accelerators of each kind, e.g. gpu=8,cpu=2 (a kind not named: none); "
        "default: no ceiling, a node's first birth sets what it may be",
    )
    token_create.add_argument(
        "--model",
        action="append",
        metavar="MODEL",
        help="an accepted accelerator model (repeat for several; default any)",
    )
    token_create.add_argument(
        "--max-memory",
        type=size_bytes_argument,
        metavar="SIZE",
        default=None,
        help="at most this much memory per accelerator: 80GiB, 24GB",
    )
    token_create.set_defaults(handler=cmd_join_token_create)
    token_list = join_token_commands.add_parser("list", help="every join token (no secrets)")
    add_client_options(token_list, nested=True)
    token_list.set_defaults(handler=cmd_join_token_list)
    token_revoke = join_token_commands.add_parser("revoke", help="revoke a join token")
    add_client_options(token_revoke, formats=ACTION_FORMATS, nested=True)
    token_revoke.add_argument("token_id", metavar="ID")
    token_revoke.set_defaults(handler=cmd_join_token_revoke)
    nodes_revoke = nodes_commands.add_parser(
        "revoke", help="refuse a node at once and disable its broker account (admin)"
    )
    add_client_options(nodes_revoke, formats=ACTION_FORMATS, nested=True)
    nodes_revoke.add_argument("node_id", metavar="NODE")
    add_confirm_bulk_option(nodes_revoke)
    nodes_revoke.set_defaults(handler=cmd_nodes_revoke)
    for action, text in (
        ("cordon", "no new work lands on the node; what runs stays (admin)"),
        ("uncordon", "the node takes new work again (admin)"),
        ("drain", "cordon the node and move its work elsewhere (admin)"),
    ):
        command = nodes_commands.add_parser(action, help=text)
        add_client_options(command, formats=ACTION_FORMATS, nested=True)
        command.add_argument("node_id", metavar="NODE")
        if action == "drain":
            add_confirm_bulk_option(command)
        command.set_defaults(handler=cmd_nodes_admin)
    node_set = nodes_commands.add_parser(
        "set", help="a node's admin taints and labels, beside its agent's (admin)"
    )
    add_client_options(node_set, formats=ACTION_FORMATS, nested=True)
    node_set.add_argument("node_id", metavar="NODE")
    node_set.add_argument(
        "--taint",
        action="append",
        metavar="KEY=VALUE:EFFECT",
        help="repeat for several; --taint '' clears them",
    )
    node_set.add_argument(
        "--label", action="append", type=labels_argument, metavar="K=V,...", help="replaces"
    )
    node_set.set_defaults(handler=cmd_nodes_admin)
    nodes_approve = nodes_commands.add_parser(
        "approve",
        help="approve a pending node as its birth says it is; it takes work again (admin)",
    )
    add_client_options(nodes_approve, formats=ACTION_FORMATS, nested=True)
    nodes_approve.add_argument("node_id", metavar="NODE")
    nodes_approve.add_argument(
        "--trust-figures",
        action="store_true",
        help="take the node's own speed and power figures, not the model table's",
    )
    nodes_approve.set_defaults(handler=cmd_nodes_approve)
    nodes_enrolled = nodes_commands.add_parser("enrolled", help="enrolled node identities (admin)")
    add_client_options(nodes_enrolled, nested=True)
    nodes_enrolled.set_defaults(handler=cmd_nodes_enrolled)
    nodes_unenrolled = nodes_commands.add_parser(
        "unenrolled",
        help="nodes refused as not enrolled that prove an enrolment of this control plane "
        "(after a store lost without a backup; admin)",
    )
    add_client_options(nodes_unenrolled, nested=True)
    nodes_unenrolled.set_defaults(handler=cmd_nodes_unenrolled)
    nodes_readmit = nodes_commands.add_parser(
        "readmit",
        help="enrol nodes again as their enrolment certificates say (admin): no visit to "
        "the devices, their work keeps running",
    )
    add_client_options(nodes_readmit, formats=ACTION_FORMATS, nested=True)
    nodes_readmit.add_argument("node_ids", nargs="*", metavar="NODE")
    nodes_readmit.add_argument(
        "--all", action="store_true", help="every node `greenfed nodes unenrolled` lists"
    )
    nodes_readmit.set_defaults(handler=cmd_nodes_readmit)

    clusters = commands.add_parser(
        "clusters", help="clusters with schedulers of their own (Slurm) as places to run (admin)"
    )
    add_client_options(clusters)
    clusters.set_defaults(handler=cmd_clusters, clusters_command="list")
    clusters_commands = clusters.add_subparsers(dest="clusters_command", metavar="COMMAND")
    clusters_list = clusters_commands.add_parser("list", help="every cluster, how it is doing")
    add_client_options(clusters_list, nested=True)
    clusters_add = clusters_commands.add_parser("add", help="register a cluster")
    add_client_options(clusters_add, formats=ACTION_FORMATS, nested=True)
    cluster_arguments.add_arguments(clusters_add)
    clusters_remove = clusters_commands.add_parser(
        "remove", help="remove a cluster (its nodes leave greenfed)"
    )
    add_client_options(clusters_remove, formats=ACTION_FORMATS, nested=True)
    clusters_remove.add_argument("name", metavar="NAME")

    mqtt = commands.add_parser("mqtt", help="the MQTT broker's accounts for third parties (admin)")
    mqtt_commands = mqtt.add_subparsers(dest="mqtt_command", metavar="COMMAND", required=True)
    mqtt_accounts = mqtt_commands.add_parser("accounts", help="read-only subscriber accounts")
    accounts_commands = mqtt_accounts.add_subparsers(
        dest="mqtt_accounts_command", metavar="COMMAND", required=True
    )
    accounts_create = accounts_commands.add_parser(
        "create", help="make an account (or give it a new password); prints the password once"
    )
    add_client_options(accounts_create, formats=ACTION_FORMATS)
    accounts_create.add_argument("name", metavar="NAME", help="its broker username")
    accounts_create.add_argument(
        "--role",
        choices=["telemetry-reader"],
        default="telemetry-reader",
        help="what it may do: read every node's telemetry and births, nothing else",
    )
    accounts_create.set_defaults(handler=cmd_mqtt_accounts)
    accounts_revoke = accounts_commands.add_parser(
        "revoke", help="disable an account (its connections are dropped)"
    )
    add_client_options(accounts_revoke, formats=ACTION_FORMATS)
    accounts_revoke.add_argument("name", metavar="NAME")
    accounts_revoke.set_defaults(handler=cmd_mqtt_accounts)

    schema = commands.add_parser("schema", help="print the JSON Schemas of the MQTT payloads")
    schema.add_argument(
        "channel",
        nargs="?",
        choices=["status", "telemetry", "desired", "reported", "events", "logs"],
        help="print only this payload's schema",
    )
    schema.add_argument("--topic-root", default="greenfed")
    schema.set_defaults(handler=cmd_schema)

    bench = commands.add_parser("bench", help="performance benchmarks")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, metavar="COMMAND")
    bench_scheduler = bench_commands.add_parser(
        "scheduler",
        help="schedule a synthetic heterogeneous cluster and queue; print throughput and latency",
    )
    bench_scheduler.add_argument("--nodes", type=non_negative_int, default=10_000)
    bench_scheduler.add_argument("--jobs", type=non_negative_int, default=20_000)
    bench_scheduler.add_argument("--seed", type=int, default=0)
    bench_scheduler.add_argument("--json", action="store_true", help="one compact JSON object")
    bench_scheduler.add_argument(
        "--sweep", action="store_true", help="1,000 to 50,000 nodes, twice as many jobs"
    )
    bench_scheduler.set_defaults(handler=cmd_bench_scheduler)

    evaluate = commands.add_parser(
        "eval",
        help="trace-driven evaluation of scheduling policies on real 2023 grid data",
        description=(
            "Simulate the same fleet and workload under each policy, driving the real "
            "scheduler over recorded carbon and price series (forecasts, never the "
            "future), and compare energy, emissions, cost, waits, deadlines and SLOs."
        ),
    )
    evaluate.add_argument("--days", type=positive_float, default=14.0)
    evaluate.add_argument(
        "--start", type=_date, default=date(2023, 6, 1), help="UTC date (default 2023-06-01)"
    )
    evaluate.add_argument(
        "--policies",
        type=_policy_list,
        default=["fifo-binpack", "spread", "green", "balanced"],
        help="comma-separated: green, cost, latency, balanced, fifo-binpack, spread, "
        "green-spatial, green-temporal (default fifo-binpack,spread,green,balanced)",
    )
    evaluate.add_argument("--seed", type=int, default=2023, help="workload seed (default 2023)")
    evaluate.add_argument(
        "--load",
        type=positive_float,
        default=0.5,
        help="generated training load, as a share of the cloud GPU throughput (default 0.5)",
    )
    evaluate.add_argument(
        "--generator",
        choices=("default", "trace"),
        default="default",
        help="generated workload's shape: default, or trace (long jobs and many 8-GPU gangs, "
        "shaped like published GPU-cluster traces; cloud/eval/trace_shaped.py)",
    )
    evaluate.add_argument("--fleet", type=Path, help="fleet file (default: the built-in fleet)")
    evaluate.add_argument(
        "--workload", type=Path, help="workload file, TOML or .json (default: generated)"
    )
    evaluate.add_argument(
        "--carbon-dir", type=Path, help="directory of carbon and price traces (default: shipped)"
    )
    evaluate.add_argument(
        "--forecaster", default="profile-level", help="forecaster for the traces' future"
    )
    evaluate.add_argument(
        "--perfect-forecast",
        action="store_true",
        help="use the recorded future as the forecast: an oracle input, not an upper bound "
        "(a policy can do worse with it); the offline optimum is the bound",
    )
    evaluate.add_argument(
        "--patience",
        type=float,
        metavar="SECONDS",
        help="how long policies that shift in time may hold a training job for cleaner "
        "capacity that frees by then (default 1800; 0: never)",
    )
    evaluate.add_argument(
        "--optimum",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="solve the offline optimum (linear programs, HiGHS, a few seconds) and show "
        "each policy's share of its training, inference and total CO2 saving (default; "
        "--no-optimum skips it)",
    )
    evaluate.add_argument(
        "--allow-missing-zones",
        action="store_true",
        help="account work in fleet zones without a carbon series with the conservative "
        "fallback (counted in the table) instead of refusing the scenario",
    )
    evaluate.add_argument(
        "--min-saving",
        type=float,
        help=(
            "temporal shifting defers a flexible job only for at least this share less "
            "(default: no temporal shifting, except in the green-temporal ablation: 0.5)"
        ),
    )
    evaluate.add_argument(
        "--no-migration",
        dest="migration",
        action="store_false",
        help="never move running jobs to cleaner capacity (an ablation)",
    )
    evaluate.add_argument(
        "--no-power-capping",
        dest="power_capping",
        action="store_false",
        help="never hold training GPUs to a lower power limit (an ablation)",
    )
    evaluate.add_argument(
        "--no-room-making",
        dest="room_making",
        action="store_false",
        help="never move running jobs to make room for a waiting worker (an ablation)",
    )
    evaluate.add_argument("--json", action="store_true", help="a JSON list, one object per policy")
    evaluate.add_argument("--plot", type=Path, metavar="FILE.png", help="needs greenfed[plot]")
    evaluate.add_argument(
        "--dump-workload", type=Path, metavar="FILE.json", help="write the workload used"
    )
    evaluate.set_defaults(handler=cmd_eval)

    add_work_commands(commands)
    add_job_control_commands(commands)
    add_access_commands(commands)
    add_upgrade_commands(commands, nodes_commands)
    add_store_commands(commands)
    add_declarative_commands(commands)  # after the commands it adds options to

    completion = commands.add_parser(
        "completion",
        help="print a shell completion script: bash or zsh",
        description=(
            "Print a completion script for greenfed's commands, options and their values, "
            "generated from this command line. bash: source <(greenfed completion bash), or "
            "write it to /etc/bash_completion.d/greenfed. zsh: write it to a directory of "
            "$fpath as _greenfed (docs/cli.md)."
        ),
    )
    completion.add_argument("shell", choices=["bash", "zsh"])
    completion.set_defaults(handler=cmd_completion)

    version = commands.add_parser("version", help="print the version")
    version.set_defaults(handler=cmd_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _run(argv)
        sys.stdout.flush()  # a reader that left (`| head -1`) shows here, not at exit
        return code
    except BrokenPipeError:
        # Nobody reads any more: no message, no traceback, and nothing more to write at
        # exit (https://docs.python.org/3/library/signal.html#note-on-sigpipe).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILURE


def _run(argv: Sequence[str] | None) -> int:
    # The parser (about 0.3 MB) is dropped before the command runs: an agent runs for months.
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the upgrade supervisor's child's
    return run_command(args)


if __name__ == "__main__":
    raise SystemExit(main())
