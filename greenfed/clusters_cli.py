"""`greenfed clusters add|list|remove`: clusters with schedulers of their own (Slurm) as
places greenfed runs work, through a running control plane's REST API (admin); each
prints as `-o` asks (`greenfed.output`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Final, TextIO

import msgspec
from rich.table import Table
from rich.text import Text

from cloud.clusters.views import ClusterList, ClusterSpec, ClusterView
from greenfed.api_client import ApiClient, CliError, path_segment
from greenfed.arguments import EXIT_OK, EXIT_USAGE
from greenfed.output import Output, emit
from greenfed.work_commands import act_and_say, ago, at_utc, console, plain
from shared.errors import FieldError


def _pairs(values: list[str] | None, option: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for value in values or ():
        key, sep, item = value.partition("=")
        if not sep or not key or not item:
            raise CliError(f"{option} {value!r}: expected KEY=VALUE", EXIT_USAGE)
        found[key] = item
    return found


def _token(path: str | None) -> str:
    if not path:
        return ""
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as error:
        raise CliError(f"--rest-token-file {path}: {error}", EXIT_USAGE) from None


def spec_of(args: argparse.Namespace) -> ClusterSpec:
    """The registration the command line describes; raises `CliError` naming the option."""
    partitions: dict[str, Any] = {}
    for value in args.partition or ():
        name, _, placement = value.partition("=")
        if not placement:
            partitions[name] = None
            continue
        zone, sep, region = placement.partition("/")
        if not sep:
            raise CliError(f"--partition {value!r}: expected NAME or NAME=ZONE/REGION", EXIT_USAGE)
        partitions[name] = {"zone": zone, "region": region}
    nice: dict[str, int] = {}
    for key, value in _pairs(args.nice, "--nice").items():
        try:
            nice[key] = int(value)
        except ValueError:
            raise CliError(f"--nice {key}={value}: not a whole number", EXIT_USAGE) from None
    document = {
        "name": args.name,
        "kind": "slurm",
        "zone": args.zone,
        "region": args.region,
        "partitions": partitions,
        "slurm": {
            "rest_url": args.rest or "",
            "rest_user": args.rest_user or "",
            "rest_token": _token(args.rest_token_file),
            "ssh": args.ssh or "",
            "slurm_conf": args.slurm_conf or "",
            "bin_dir": args.bin_dir or "",
            "work_dir": args.work_dir,
            "account": args.account or "",
            "max_time_limit_s": args.max_time_limit,
            "qos": _pairs(args.qos, "--qos"),
            "nice": nice,
        },
        "gres_models": _pairs(args.gres_model, "--gres-model"),
        "refresh_interval_s": args.refresh_interval,
        "accepts_secrets": args.accepts_secrets,
    }
    try:
        return msgspec.convert(document, ClusterSpec)
    except (msgspec.ValidationError, FieldError) as error:
        raise CliError(f"greenfed clusters add: {error}", EXIT_USAGE) from None


def _summary(cluster: ClusterView) -> str:
    gpus = ", ".join(f"{count} {model}" for model, count in sorted(cluster.accelerators.items()))
    unknown = ", ".join(
        f"{count} {name}" for name, count in sorted(cluster.unknown_accelerator_types.items())
    )
    return gpus + (f" (unknown types, not used: {unknown})" if unknown else "")


def _via(cluster: ClusterView) -> str:
    """How it is reached, and whether greenfed's choice of machines holds there."""
    via = cluster.interface or ("slurmrestd" if cluster.spec.slurm.rest_url else "commands")
    return via + (" (Slurm picks the machines)" if cluster.pins_machines is False else "")


async def add_cluster(client: ApiClient, spec: ClusterSpec, *, output: Output) -> int:
    body = msgspec.json.encode(spec)
    cluster = (await client.ask("POST", "/v1/clusters", ClusterView, body=body)).value
    emit(
        output,
        cluster,
        lambda: output.out.write(
            f"cluster {cluster.spec.name} registered ({cluster.spec.kind}, {cluster.spec.zone} "
            f"{cluster.spec.region}); its machines appear in `greenfed nodes` as "
            f"{cluster.spec.name}.<machine> once it answers (greenfed clusters list)\n"
        ),
    )
    return EXIT_OK


async def list_clusters(client: ApiClient, *, output: Output) -> int:
    clusters = await client.get("/v1/clusters", ClusterList)
    emit(output, clusters, lambda: render_clusters(clusters, output.out, wide=output.wide))
    return EXIT_OK


def _partitions_text(cluster: ClusterView) -> str:
    """The partitions greenfed may use, where they are when not where the cluster is."""
    if not cluster.spec.partitions:
        return "every one"
    return ", ".join(
        name if placement is None else f"{name} ({placement.zone}/{placement.region})"
        for name, placement in cluster.spec.partitions.items()
    )


# `-o wide`: which partitions greenfed uses, when it last heard from the cluster, who added it.
CLUSTERS_WIDE: Final = ("partitions", "last contact (UTC)", "created (UTC)", "created by")


def render_clusters(clusters: ClusterList, out: TextIO, *, wide: bool = False) -> None:
    table = Table(title=f"clusters: {clusters.count}", title_justify="left")
    for column in ("cluster", "kind", "via", "zone", "region", "state", "nodes",
                   "accelerators", "queue", "greenfed jobs"):  # fmt: skip
        table.add_column(column)
    for column in CLUSTERS_WIDE if wide else ():
        table.add_column(column)
    for cluster in clusters.items:
        if cluster.reachable:
            state = Text("reachable", style="green")
        else:
            # The cluster's own words (its last error): printable, never markup.
            contact = ago(cluster.last_contact_at) if cluster.last_contact_at else "never"
            state = Text.assemble(("unreachable", "red"), f" (last contact {contact}): ")
            state.append_text(plain(cluster.last_error))
        table.add_row(
            cluster.spec.name,
            cluster.spec.kind,
            plain(_via(cluster)),
            cluster.spec.zone,
            cluster.spec.region,
            state,
            str(cluster.nodes),
            plain(_summary(cluster)),
            f"{cluster.pending_jobs} pending",
            str(cluster.greenfed_jobs_running),
            *(
                (
                    plain(_partitions_text(cluster)),
                    at_utc(cluster.last_contact_at),
                    at_utc(cluster.created_at),
                    plain(cluster.created_by),
                )
                if wide
                else ()
            ),
        )
    console(out, wide=wide).print(table)


async def remove_cluster(client: ApiClient, name: str, *, output: Output) -> int:
    return await act_and_say(
        client,
        "DELETE",
        f"/v1/clusters/{path_segment(name)}",
        ClusterView,
        lambda cluster: f"cluster {cluster.spec.name} removed; its nodes left the registry",
        output=output,
    )
