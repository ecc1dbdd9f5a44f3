"""The REST shapes of `/v1/clusters` (docs/rest.md#clusters), shared by the API, the
store (a registration is kept as its `ClusterSpec`) and the CLI."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Final, Literal

import msgspec
import yarl

from cloud.fleet.enrolment_views import Zone
from shared.accelerators import ACCELERATORS
from shared.errors import FieldError, worded_pattern

MAX_CLUSTERS: Final = 64
# A cluster's name prefixes its nodes' ids (`<cluster>.<machine>`): one topic level's
# characters, no dot (the separator).
# Each pattern is worded (shared/errors.py): a refusal says what it takes, not the regex.
CLUSTER_NAME_PATTERN: Final = worded_pattern(
    r"^[a-z0-9][a-z0-9_-]{0,62}$(?!\n)",
    "must be lower-case letters, digits, '_' and '-' (no '.'), starting with a letter or "
    "digit; at most 63 characters",
)
_NAME = Annotated[str, msgspec.Meta(pattern=CLUSTER_NAME_PATTERN)]
# Absolute paths, or empty where that means the default.
_PATH = Annotated[
    str,
    msgspec.Meta(
        max_length=4096,
        pattern=worded_pattern(
            r"^(/[^\x00]*)?$",
            "must be an absolute path (starting with '/') without NUL characters, or empty",
        ),
    ),
]
_SLURM_NAME = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=128,
        pattern=worded_pattern(
            r"^[^\s,=|]+$", "must be a Slurm name: no whitespace, ',', '=' or '|'"
        ),
    ),
]
_PRIORITY = Literal["p0", "p1", "p2"]
# An accelerator model greenfed knows (shared/accelerators.py); checked in ClusterSpec.
_MODEL = Annotated[
    str, msgspec.Meta(max_length=256, extra_json_schema={"enum": sorted(ACCELERATORS)})
]


class _Body(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class PartitionPlacement(_Body, frozen=True, kw_only=True):
    """Where a partition's machines are, where it differs from the cluster's."""

    zone: Zone
    region: Zone


class SlurmAccessSpec(_Body, frozen=True, kw_only=True):
    """How the control plane reaches a Slurm cluster: its slurmrestd (`rest_url`), or its
    commands here (this host is a login node) or on a login node over SSH."""

    # unix:/path/to/slurmrestd.socket (rest_auth/local) or http[s]://host:port (JWT).
    rest_url: Annotated[
        str,
        msgspec.Meta(
            max_length=4096,
            pattern=worded_pattern(
                r"^(unix:/[^\x00]+|https?://[^\s/]+/?)?$",
                "must be unix:/<socket path>, or http[s]://host[:port] with no path",
            ),
        ),
    ] = ""
    rest_user: Annotated[
        str,
        msgspec.Meta(
            max_length=128,
            pattern=worded_pattern(r"^[^\s:]*$", "must have no whitespace or ':'"),
        ),
    ] = ""
    # A JWT for rest_auth/jwt: a secret (encrypted at rest, shown masked).
    rest_token: Annotated[str, msgspec.Meta(max_length=16384)] = ""

    # [user@]host: never an option of ssh's own (no leading "-").
    ssh: Annotated[
        str,
        msgspec.Meta(
            max_length=256,
            pattern=worded_pattern(
                r"^([A-Za-z0-9._][A-Za-z0-9._@:-]*)?$",
                "must be [user@]host: letters, digits, '.', '_', '@', ':' and '-', starting "
                "with a letter, digit, '.' or '_'",
            ),
        ),
    ] = ""
    slurm_conf: _PATH = ""  # where the commands run; empty: their default
    bin_dir: _PATH = ""  # where the commands are; empty: on the PATH
    # Output files and default working directory, on the cluster's shared filesystem.
    # A job's working_dir rule (no whitespace or control characters: `scontrol -o` prints
    # `StdOut=<path>` among its `Key=Value` pairs), and no `%` or `\`, which Slurm
    # expands in `--output` (`%j`) or takes as "expand nothing".
    work_dir: Annotated[
        str,
        msgspec.Meta(
            max_length=4096,
            pattern=worded_pattern(
                r"^/[^\s\x00-\x1f\x7f-\x9f%\\]*$(?!\n)",
                "must be an absolute path (starting with '/') with no whitespace, control "
                "characters, '%' or '\\'",
            ),
        ),
    ] = "/tmp"
    account: Annotated[str, msgspec.Meta(max_length=128)] = ""
    qos: dict[_PRIORITY, _SLURM_NAME] = {}  # greenfed priority -> QOS
    nice: dict[_PRIORITY, Annotated[int, msgspec.Meta(ge=-10000, le=10000)]] = {}
    # No job runs longer there (`--time`); null: twice its estimate, else the partition's.
    max_time_limit_s: Annotated[float, msgspec.Meta(ge=60, le=366 * 86400)] | None = None


class ClusterSpec(_Body, frozen=True, kw_only=True):
    """What an admin registers (`POST /v1/clusters`)."""

    name: _NAME
    kind: Literal["slurm"] = "slurm"
    zone: Zone
    region: Zone
    partitions: Annotated[
        dict[_SLURM_NAME, PartitionPlacement | None], msgspec.Meta(max_length=256)
    ] = {}
    slurm: SlurmAccessSpec = SlurmAccessSpec()
    # The cluster's GPU type names -> greenfed's accelerator models (shared/accelerators.py).
    gres_models: Annotated[dict[_SLURM_NAME, _MODEL], msgspec.Meta(max_length=64)] = {}
    refresh_interval_s: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 5.0
    # Whether jobs with secrets may run there: the batch script exports them, and the
    # cluster keeps it (its administrators can read it). Off: such jobs go elsewhere.
    accepts_secrets: bool = False

    def __post_init__(self) -> None:
        if self.slurm.rest_url and (self.slurm.ssh or self.slurm.slurm_conf):
            raise FieldError(
                "slurm.rest_url",
                "a cluster is reached through its slurmrestd or through its commands "
                "(slurm.ssh, slurm.slurm_conf), not both",
            )
        if self.slurm.rest_url and (problem := rest_url_problem(self.slurm.rest_url)):
            raise FieldError("slurm.rest_url", problem)
        if (self.slurm.rest_token or self.slurm.rest_user) and not self.slurm.rest_url:
            field = "slurm.rest_token" if self.slurm.rest_token else "slurm.rest_user"
            raise FieldError(field, "only with slurm.rest_url (a slurmrestd to present it to)")
        for type_name, model in self.gres_models.items():
            if model not in ACCELERATORS:
                raise FieldError(
                    f"gres_models.{type_name}",
                    f"{model!r} is not an accelerator model greenfed knows",
                )


def rest_url_problem(rest_url: str) -> str:
    """Why slurmrestd cannot be reached at `rest_url` (its pattern checked: a socket
    path or `http[s]://` and no path); "": it can be tried. Read as aiohttp reads it."""
    if rest_url.startswith("unix:"):
        return ""
    # The reasons leave the URL out: one that holds a password must not be repeated.
    try:
        url = yarl.URL(rest_url)
    except ValueError as error:  # "Port out of range 0-65535", "Invalid IPv6 URL"
        return f"not a URL: {error}"
    if not url.host:
        return "names no host"
    if url.port is None or not 1 <= url.port <= 65535:
        return "the port is 1 to 65535"
    if url.user is not None or url.password is not None:
        return "no credentials in the URL: they are rest_user and rest_token"
    if "?" in rest_url or "#" in rest_url:  # even empty: the request paths follow it
        return "http[s]://host:port, nothing after it"
    return ""


class ClusterView(msgspec.Struct, frozen=True, kw_only=True):
    """A registered cluster and how it is doing (as this replica sees it)."""

    spec: ClusterSpec
    created_at: datetime
    created_by: str
    reachable: bool
    last_contact_at: datetime | None
    last_error: str
    nodes: int
    accelerators: dict[str, int]  # by greenfed model
    # GPUs of types no model is known for: counted, never guessed (nothing runs there).
    unknown_accelerator_types: dict[str, int]
    # Machines whose names cannot be node ids: not used.
    skipped_machines: tuple[str, ...]
    pending_jobs: int  # the cluster's own queue, anyone's jobs
    greenfed_jobs_running: int
    # How it is reached (`slurmrestd v0.0.38`, `Slurm commands, here`; "": not yet).
    interface: str = ""
    # Whether jobs run on the machines greenfed chose (false: the cluster picks them,
    # slurmrestd v0.0.38; null: not known yet).
    pins_machines: bool | None = None


class ClusterList(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[ClusterView, ...]
    count: int


SPEC_DECODER: Final = msgspec.json.Decoder(ClusterSpec)
