"""`greenfed clusters add`'s options (kept apart from greenfed/clusters_cli.py so that
building the parser loads nothing of the control plane: an agent runs for months)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`greenfed clusters add`'s options."""
    parser.add_argument("name", metavar="NAME", help="a-z, 0-9, - and _; prefixes its nodes' ids")
    parser.add_argument("--slurm", action="store_true", required=True, help="a Slurm cluster")
    parser.add_argument("--zone", required=True, help="its grid zone, e.g. DE")
    parser.add_argument("--region", required=True, help="its network region, e.g. europe-west3")
    parser.add_argument(
        "--partition",
        action="append",
        metavar="NAME[=ZONE/REGION]",
        help="a partition greenfed may use (repeat; default: every one), where it is",
    )
    parser.add_argument(
        "--rest",
        metavar="URL",
        help="reach it through slurmrestd: unix:/path/to/socket (rest_auth/local) or "
        "http[s]://host:port (a JWT: --rest-user, --rest-token-file); default: its commands",
    )
    parser.add_argument("--rest-user", help="the Slurm user the JWT is for")
    parser.add_argument(
        "--rest-token-file",
        metavar="FILE",
        help="a file holding the JWT (a secret: never an argument)",
    )
    parser.add_argument("--ssh", help="[user@]host of a login node (default: run them here)")
    parser.add_argument("--slurm-conf", help="the cluster's slurm.conf where the commands run")
    parser.add_argument("--bin-dir", help="where the Slurm commands are (default: PATH)")
    parser.add_argument(
        "--work-dir", default="/tmp", help="job output and working directory on the cluster"
    )
    parser.add_argument("--account", help="the Slurm account jobs are charged to")
    parser.add_argument(
        "--max-time-limit", type=float, metavar="S", help="no job runs longer there (seconds)"
    )
    parser.add_argument("--qos", action="append", metavar="PRIORITY=QOS", help="e.g. p0=high")
    parser.add_argument("--nice", action="append", metavar="PRIORITY=N", help="e.g. p2=100")
    parser.add_argument(
        "--gres-model",
        action="append",
        metavar="TYPE=MODEL",
        help="a GPU type's accelerator model, e.g. 'a100_80g=NVIDIA A100-SXM4-80GB'",
    )
    parser.add_argument(
        "--accepts-secrets",
        action="store_true",
        help="run jobs with secrets there (its batch scripts hold them: its admins can read them)",
    )
    parser.add_argument(
        "--refresh-interval", type=float, default=5.0, help="seconds between looks (default 5)"
    )
