"""Typed settings: a TOML file plus `GREENFED_<SECTION>__<KEY>` environment overrides.

Built once in `main()` and passed down. Every section forbids unknown keys so a
typo is an error that names the key, never a silently ignored setting.
"""

from __future__ import annotations

import math
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal
from urllib.parse import unquote, urlsplit

import msgspec

from shared.errors import (
    FieldError,
    FieldPath,
    MissingFieldError,
    UnknownFieldError,
    dotted_path,
)
from shared.messages import KERNEL_PIDS_MAX, AcceleratorKind, NodeTaint, Site
from shared.placement_names import placement_error
from shared.redact import redact_url
from shared.taints import MAX_TAINTS, parse_taint
from shared.topics import (
    DEFAULT_TOPIC_ROOT,
    TopicError,
    is_valid_node_id,
    validate_root,
    validate_share_group,
)

ENV_PREFIX = "GREENFED_"
# Double underscore separates section from key, so keys may contain single ones
# and unrelated GREENFED_* variables (GREENFED_JOB_ID given to jobs) are left alone.
ENV_SEPARATOR = "__"

PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the key and where it came from.
    `key` is that key (`mqtt.url`) where one is at fault."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class MqttEndpoint(msgspec.Struct, frozen=True, kw_only=True):
    host: str
    port: int
    tls: bool
    username: str | None = None
    password: str | None = None


def parse_mqtt_url(url: str) -> MqttEndpoint:
    """`mqtt://[user[:password]@]host[:port]` or `mqtts://...` (TLS, default port 8883).
    An error shows the URL with its password masked: it goes to a terminal or a journal."""
    parts = urlsplit(url)
    shown = redact_url(url)
    if parts.scheme not in ("mqtt", "mqtts"):
        raise ValueError(f"MQTT url {shown!r} must start with mqtt:// or mqtts://")
    if not parts.hostname:
        raise ValueError(f"MQTT url {shown!r} has no host")
    if parts.path not in ("", "/") or parts.query:
        because = (
            " (a '/', '?' or '#' in the password must be percent-encoded: %2F, %3F, %23)"
            if parts.password is None and "@" in url
            else ""
        )
        raise ValueError(f"MQTT url {shown!r} must not have a path or query{because}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"MQTT url {shown!r} has an invalid port") from None
    tls = parts.scheme == "mqtts"
    return MqttEndpoint(
        host=parts.hostname,
        port=port or (8883 if tls else 1883),
        tls=tls,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
    )


class Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A table of settings. Its checks run in `__post_init__`; a section with checks of
    its own calls this one first, so a non-finite number is named before anything else
    compares with it."""

    def __post_init__(self) -> None:
        # msgspec's bounds let `inf` through wherever a key has no upper one (and NaN
        # where it has none at all): a time of `inf` crashed `greenfed cloud`, and a
        # telemetry interval of `inf` made births every control plane refuses.
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value):
                raise FieldError(name, "must be a finite number")


class MqttSettings(Section, frozen=True, kw_only=True):
    url: str = "mqtt://127.0.0.1:1883"
    username: str | None = None
    password: str | None = None
    topic_root: str = DEFAULT_TOPIC_ROOT
    keepalive_s: Annotated[int, msgspec.Meta(ge=5, le=3600)] = 30
    connect_timeout_s: PositiveFloat = 10.0
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_insecure: bool = False
    reconnect_initial_s: PositiveFloat = 0.5
    reconnect_max_s: PositiveFloat = 30.0
    max_payload_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 256 * 1024
    # Control plane: the shared-subscription group its replicas take nodes' telemetry
    # through, each replica a share, and a digest of what each heard for the others
    # (cloud/fleet/digest.py). "" (default): every replica takes all of it, as a broker
    # without shared subscriptions (the embedded one) requires. Mosquitto >= 1.6: set it.
    shared_group: str = ""
    # How often a replica publishes its digest while `shared_group` is set.
    digest_interval_s: Annotated[float, msgspec.Meta(gt=0, le=60)] = 1.0

    # Checks across a value's type raise a FieldError naming the key.
    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            parse_mqtt_url(self.url)
        except ValueError as error:
            raise FieldError("url", str(error)) from None
        try:
            validate_root(self.topic_root)
        except TopicError as error:
            raise FieldError("topic_root", str(error)) from None
        if self.reconnect_max_s < self.reconnect_initial_s:
            raise FieldError("reconnect_max_s", "must be >= reconnect_initial_s")
        try:
            validate_share_group(self.shared_group)
        except TopicError as error:
            raise FieldError("shared_group", str(error)) from None


# Node ids that are fixed routes under /v1/nodes/ of the control plane's API: a node so
# named could be neither viewed nor changed there (GET /v1/nodes/enrolled is the list of
# enrolled nodes). The agent refuses them, and so does enrolment; a test reads the API's
# route table to keep this whole.
RESERVED_NODE_IDS: Final = frozenset({"enrol", "enrolled", "join-tokens", "readmit", "unenrolled"})

OUTBOX_MAX_BYTES = 64 * 1024 * 1024
OUTBOX_MAX_AGE_S = 7 * 86_400.0


# Work directories' home under the data directory when agent.work_dir is empty.
DEFAULT_WORK_SUBDIR: Final = "work"


def work_dir_problem(work_dir: str, data_dir: str) -> str | None:
    """Why `work_dir` cannot hold workers' work directories (None: it can). The agent
    makes it 0711 and removes what jobs leave in it, and a sandbox hides it: it must
    name a directory of its own, never one that holds the agent's files. Judged here
    as written, and by real paths when the agent starts (edge/sandbox/setup.py)."""
    if "\x00" in work_dir or not work_dir.startswith("/"):
        return f"{work_dir!r} must be an absolute path"
    path = Path(work_dir)
    if any(part in (".", "..") for part in work_dir.split("/")) or path == Path("/"):
        return f"{work_dir!r} must name a directory below /, without '.' or '..'"
    data = Path(data_dir).expanduser() if data_dir else None
    if data is None or not data.is_absolute():
        return None  # the data directory is judged where it is known (relative: cwd)
    data = Path(os.path.normpath(data))
    if path == data or path in data.parents:
        return f"{work_dir!r} holds the agent's data directory {str(data)!r}: name another"
    default = data / DEFAULT_WORK_SUBDIR
    if data in path.parents and path != default and default not in path.parents:
        return (
            f"{work_dir!r} is inside the agent's data directory {str(data)!r}, beside its "
            f"private files: name a directory outside it (or leave it empty: {default})"
        )
    return None


class AgentSettings(Section, frozen=True, kw_only=True):
    node_id: str = ""  # empty: the host name
    site: Site = "edge"
    zone: str = "unknown"
    region: str = "unknown"
    labels: dict[str, str] = {}
    # Kubernetes-style `key=value:NoSchedule` / `:PreferNoSchedule` (shared/taints.py):
    # only work that tolerates them is placed here, or other work avoids it.
    taints: Annotated[tuple[str, ...], msgspec.Meta(max_length=MAX_TAINTS)] = ()
    telemetry_interval_s: Annotated[float, msgspec.Meta(ge=0.05)] = 5.0
    telemetry_jitter_ratio: Annotated[float, msgspec.Meta(ge=0, le=0.5)] = 0.1
    probes: tuple[Literal["cpu", "nvidia", "npu"], ...] = ("cpu", "nvidia", "npu")
    data_dir: str = ""  # empty: $XDG_DATA_HOME/greenfed/agent, else ~/.local/share/greenfed/agent
    # Where training workers' work directories (each one's HOME) are made: an absolute
    # path, best on a filesystem of its own, since nothing limits what a job writes
    # there and a full data directory costs the agent its state and outbox
    # (docs/isolation.md). Empty: data_dir/work.
    work_dir: str = ""
    training_enabled: bool | None = None  # None: nodes with site = "cloud" run training
    max_job_log_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 10 * 1024 * 1024
    # The local inference endpoint (POST /v1/infer/{deployment}), started with the
    # first deployment; port 0: any free port (the reported endpoint says which).
    inference_host: str = "127.0.0.1"
    inference_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8701
    # The host in the endpoint URL the cloud shows; empty: derived from inference_host.
    inference_advertise_host: str = ""
    # Requests waiting per deployment before new ones get 429.
    inference_queue_limit: Annotated[int, msgspec.Meta(ge=1)] = 256
    # Downloaded models kept in data_dir/models, least recently used evicted first.
    model_cache_bytes: Annotated[int, msgspec.Meta(ge=1)] = 10 * 1024**3
    # The control plane's Ed25519 public key (base64 of the 32 raw bytes), written by
    # `greenfed edge enrol`: every `desired` document must carry its valid signature.
    # Empty: no document is trusted and none is applied (edge/agent/desired.py).
    control_plane_public_key: str = ""
    # Events and job-log chunks waiting for the broker (edge/agent/outbox.py), kept on
    # disk under data_dir/state/outbox: past this many bytes the oldest are dropped,
    # and one older than this when its turn comes is dropped unsent (both counted).
    outbox_max_bytes: Annotated[int, msgspec.Meta(ge=64 * 1024)] = OUTBOX_MAX_BYTES
    outbox_max_age_s: Annotated[float, msgspec.Meta(gt=0)] = OUTBOX_MAX_AGE_S
    # How training workers are contained (docs/isolation.md). "auto": the strongest this
    # node can give ("sandbox", else "user"), refusing training when it can give neither;
    # "sandbox" or "user": that level or training is refused; "none": workers run as the
    # agent's own user, unisolated, for a node whose operator trusts all work sent to it.
    isolation: Literal["auto", "sandbox", "user", "none"] = "auto"
    # Whom workers run as: every worker as this user (a name or a uid) ...
    worker_user: str = ""
    # ... or, when empty, a uid of its own per tenant from this range (both ends
    # included), remembered in data_dir/state/worker-uids.json.
    worker_uid_range: tuple[
        Annotated[int, msgspec.Meta(ge=1, le=4_294_967_293)],
        Annotated[int, msgspec.Meta(ge=1, le=4_294_967_293)],
    ] = (70000, 79999)
    # Processes and threads a worker may have when its job sets no pids_limit.
    worker_pids_limit: Annotated[int, msgspec.Meta(ge=16, le=KERNEL_PIDS_MAX)] = 4096
    # Host memory all workers together leave to the agent and the system.
    reserved_memory_mib: Annotated[int, msgspec.Meta(ge=0)] = 512
    # Where worker cgroups are made; empty: under the agent's own cgroup where it may
    # (cgroup v2 delegated by systemd), else "greenfed" at the root of each hierarchy.
    cgroup_root: str = ""
    # What runs work that names an image: "auto" takes podman, else docker.
    container_runtime: Literal["auto", "podman", "docker", "none"] = "auto"
    # The OCI runtime containers run with (podman --runtime), e.g. runc; empty: its own.
    oci_runtime: str = ""
    # More paths a sandboxed worker must never see (the agent's own are always hidden).
    hidden_paths: Annotated[tuple[str, ...], msgspec.Meta(max_length=64)] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        low, high = self.worker_uid_range
        if low > high:
            raise FieldError("worker_uid_range", f"[{low}, {high}] is empty: the first is larger")
        for path in self.hidden_paths:
            if not path.startswith("/"):
                raise FieldError("hidden_paths", f"{path!r} must be an absolute path")
        if self.work_dir:
            problem = work_dir_problem(self.work_dir, self.data_dir)
            if problem is not None:
                raise FieldError("work_dir", problem)
        # Below each cgroup hierarchy's mount (edge/sandbox/cgroups.py): a '..' would
        # make the workers' "cgroups" plain directories elsewhere, no limit applied while
        # the node still reports them.
        if any(part in ("..", ".") for part in self.cgroup_root.split("/")) or "\x00" in (
            self.cgroup_root
        ):
            raise FieldError(
                "cgroup_root",
                f"{self.cgroup_root!r} must be a path below each cgroup hierarchy, "
                "without '.' or '..'",
            )
        if self.node_id and not is_valid_node_id(self.node_id):
            raise FieldError(
                "node_id",
                f"{self.node_id!r} must match [A-Za-z0-9][A-Za-z0-9._-]* (one topic level)",
            )
        if self.node_id in RESERVED_NODE_IDS:
            raise FieldError(
                "node_id", f"{self.node_id!r} is reserved: it names a route of the REST API"
            )
        for text in self.taints:
            try:
                parse_taint(text)
            except ValueError as error:
                raise FieldError("taints", str(error)) from None
        # What the control plane would refuse in every birth (cloud/fleet/plausibility.py).
        invalid = placement_error(self.zone, self.region, self.labels, prefix="")
        if invalid is not None:
            raise FieldError(*invalid)

    def node_taints(self) -> tuple[NodeTaint, ...]:
        result = []
        for text in self.taints:
            key, value, effect = parse_taint(text)
            result.append(NodeTaint(key=key, value=value, effect=effect))
        return tuple(result)

    @property
    def runs_training(self) -> bool:
        return self.site == "cloud" if self.training_enabled is None else self.training_enabled

    def resolved_data_dir(self, environ: Mapping[str, str] | None = None) -> Path:
        if self.data_dir:
            return Path(self.data_dir).expanduser()
        environ = os.environ if environ is None else environ
        base = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return Path(base) / "greenfed" / "agent"

    def resolved_work_dir(self, environ: Mapping[str, str] | None = None) -> Path:
        """Where workers' work directories are made, as configured; the agent uses it
        through edge/sandbox/setup.py's workers_work_root."""
        if self.work_dir:
            return Path(self.work_dir)
        return self.resolved_data_dir(environ) / DEFAULT_WORK_SUBDIR

    def resolved_node_id(self) -> str:
        if self.node_id:
            return self.node_id
        host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).lstrip("._-")
        return host[:128] or "node"


class CloudSettings(Section, frozen=True, kw_only=True):
    api_host: str = "127.0.0.1"
    api_port: Port = 8700
    # A node is offline after this many of its own telemetry intervals without a sample
    # (this and the next: cloud/fleet/liveness.py, which also reads node_lost_grace_s).
    staleness_intervals: Annotated[float, msgspec.Meta(ge=1)] = 3.0
    liveness_check_interval_s: PositiveFloat = 1.0
    # Invalid-payload log lines per reason, at most one per this many seconds.
    invalid_log_interval_s: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    # How agents reach this API (model downloads); default: http://api_host:api_port.
    public_url: str | None = None
    # Largest ONNX model `POST /v1/models` accepts (stored under store.data_dir/models).
    max_model_bytes: Annotated[int, msgspec.Meta(ge=1)] = 2 * 1024**3
    # The Ed25519 key `desired` documents are signed with (PEM, mode 0600; made on first
    # start). Every replica must use the same file. Empty: store.data_dir/desired-signing.key.
    signing_key_file: str = ""
    # The key job secrets are encrypted with in the store (cloud/secrets/at_rest.py; made on
    # first start, mode 0600). Every replica must use the same file, and a store restored
    # from a backup needs it. Empty: store.data_dir/secrets.key.
    secrets_key_file: str = ""
    # Node credentials: "none" leaves the broker's accounts to the operator (enrolment
    # then hands out no MQTT password); "dynamic-security" provisions each enrolled node
    # over `$CONTROL/dynamic-security/v1` (Mosquitto's plugin, or the embedded broker).
    broker_accounts: Literal["none", "dynamic-security"] = "none"
    # true: only enrolled, unrevoked node ids enter the registry.
    require_enrolment: bool = False
    # Join tokens live this long unless `--ttl` says otherwise.
    join_token_ttl_s: Annotated[float, msgspec.Meta(gt=0, le=366 * 86400)] = 3600.0
    # The registry holds at most this many nodes; births beyond are rejected.
    max_nodes: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    # false: `/metrics` leaves out the per-accelerator series (DCGM_FI_DEV_*,
    # greenfed_accelerator_*; cloud/fleet/accelerator_metrics.py), for very large fleets.
    accelerator_metrics: bool = True
    # Plausibility limits on births and telemetry (cloud/fleet/plausibility.py).
    max_accelerators_per_node: Annotated[int, msgspec.Meta(ge=1)] = 256
    max_accelerator_memory_bytes: Annotated[int, msgspec.Meta(ge=1)] = 64 * 1024**4
    max_accelerator_power_w: PositiveFloat = 10_000.0
    max_clock_skew_s: PositiveFloat = 300.0
    min_telemetry_interval_s: PositiveFloat = 0.05
    max_telemetry_interval_s: PositiveFloat = 3600.0
    # HTTP: a request's headers must arrive within this long, its body within the next.
    http_header_timeout_s: PositiveFloat = 10.0
    http_body_timeout_s: PositiveFloat = 60.0
    # An admin may revoke nodes, drain nodes and cancel work this many times a minute;
    # each one more needs the header `Greenfed-Confirm: bulk` (cloud/api/bulk_actions.py;
    # 0: every one needs it).
    destructive_actions_per_minute: Annotated[int, msgspec.Meta(ge=0)] = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.public_url is not None and not self.public_url.startswith(("http://", "https://")):
            raise FieldError(
                "public_url", f"{self.public_url!r} must start with http:// or https://"
            )
        if self.max_telemetry_interval_s < self.min_telemetry_interval_s:
            raise FieldError("max_telemetry_interval_s", "must be >= min_telemetry_interval_s")


# Must match cloud.green.policies.POLICY_NAMES (a test checks): shared/ never imports cloud/.
PolicySetting = Literal[
    "green",
    "cost",
    "latency",
    "balanced",
    "fifo-binpack",
    "spread",
    "green-spatial",
    "green-temporal",
]


Quota = dict[AcceleratorKind, Annotated[int, msgspec.Meta(ge=0)]]


class CohortSettings(Section, frozen=True, kw_only=True):
    """One cohort of the tree above the tenants (`[scheduling.cohorts.<name>]`,
    cloud/scheduler/hierarchy.py): a kind not listed in `quotas` has the sum of its
    members' quotas; not in `borrowing_limit`: no limit; not in `lending_limit`: all its
    unused quota may be lent to its siblings."""

    parent: str | None = None
    quotas: Quota = {}
    borrowing_limit: Quota = {}
    lending_limit: Quota = {}


def _check_cohort_tree(cohorts: Mapping[str, CohortSettings]) -> None:
    """Parents must not form a cycle; the key named is the cohort's `parent`."""
    for name in cohorts:
        seen = [name]
        parent = cohorts[name].parent
        while parent is not None:
            if parent in seen:
                # A FieldError, not a plain ValueError: msgspec reports where in the
                # document it was raised (`scheduling`), and load_settings needs the whole
                # path to name the key and the file or variable that set it. The name is
                # quoted where a dot would split it, as `_name_mapping_keys` quotes keys.
                shown = name if _BARE_KEY.match(name) else f'"{name}"'
                raise FieldError(
                    ("cohorts", shown, "parent"),
                    "parents form a cycle: " + " -> ".join([*seen, parent]),
                )
            seen.append(parent)
            parent = cohorts[parent].parent if parent in cohorts else None


class SchedulingSettings(Section, frozen=True, kw_only=True):
    """The scheduling loop (cloud/loop, docs/scheduling.md)."""

    # false: this replica serves the API only and never takes scheduling leadership.
    enabled: bool = True
    # Named policy: weights over packing, load, speed, carbon, price and latency.
    policy: PolicySetting = "green"
    # A pass runs this long after the first trigger (submission, cancel, node change,
    # agent report), so that a burst of triggers costs one pass.
    debounce_s: Annotated[float, msgspec.Meta(ge=0, le=60)] = 0.02
    # ... and at least this often, for what time alone changes (windows, deferrals).
    interval_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 5.0
    # A pass decides at most this many queued items, the head of the queue in its order
    # (priority, fair share, submission); the rest keep their last pending reason. At
    # least every `full_pass_interval_s` a pass decides the whole queue (backfill from
    # deep in it, reasons refreshed). 0: every pass decides the whole queue.
    queue_depth: Annotated[int, msgspec.Meta(ge=0)] = 1000
    full_pass_interval_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 60.0
    # Work on a node that went offline is requeued after this long unless it returns
    # (cloud/fleet/liveness.py).
    node_lost_grace_s: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    # After taking leadership, wait this long for retained node births before the
    # first pass, so a restarted control plane does not see a fleet with holes.
    startup_settle_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 2.0
    # An allocation `assigned` to a node that has not reported it after this long gets
    # its desired document republished; after twice this long it is requeued
    # (cloud/loop/allocations.py).
    assignment_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    # Gangs rendezvous on MASTER_PORT = base + a stable hash of (job, attempt) % span.
    master_port_base: Annotated[int, msgspec.Meta(ge=1024, le=65535)] = 29500
    master_port_span: Annotated[int, msgspec.Meta(ge=1, le=30000)] = 1000
    # Policies that migrate (green, balanced, cost) may move running training that
    # declares checkpoint_interval_s to cleaner capacity as it frees (false: never) ...
    migration: bool = True
    # ... when that saves at least this share of the rest of its run's CO2 (or cost),
    migration_min_saving: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.2
    # ... and its current run has lasted at least this long. Moves are looked for at
    # most this often (a look: 0.4 s for 2,000 movable jobs on 10,000 nodes).
    migration_cooldown_s: Annotated[float, msgspec.Meta(ge=0)] = 600.0
    migration_interval_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 30.0
    # With migration on, such training may also be moved off a node to make room for
    # a gang worker that has waited for room this long since its submission and fits
    # nowhere else (docs/green.md, "Making room"); make_room = false: never.
    make_room: bool = True
    make_room_after_s: Annotated[float, msgspec.Meta(ge=0)] = 60.0
    # Temporal shifting holds a flexible job back only for at least this share less
    # CO2 (or cost) than starting now; unset (the default): policies do not shift in
    # time, which on the evaluation matrix added no cut and up to 1.1x the baseline's
    # mean wait (docs/green.md); 0.3 to 0.5 where the grid swings deeply.
    shifting_min_saving: Annotated[float, msgspec.Meta(ge=0, lt=1)] | None = None
    # Policies that cap power (green, balanced, cost) may hold new training's GPUs to
    # a lower power limit where the energy saved outweighs the longer run, deadlines
    # kept (cloud/green/power_capping.py; false: never) ...
    power_capping: bool = True
    # ... when that saves at least this share of the run's CO2 (or cost).
    power_capping_min_saving: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.03
    # Training goes only to nodes that isolate workers at least this well (docs/isolation.md:
    # none < user < sandbox); a job may ask for more with its own `isolation`.
    min_isolation: Literal["none", "user", "sandbox"] = "none"
    # Fair share (docs/scheduling.md "Queue order"): past usage counts with a weight that
    # halves every this long (0: only what each tenant holds now) ...
    fair_share_half_life_s: Annotated[float, msgspec.Meta(ge=0)] = 7 * 86400.0
    # ... and the cohort tree above the tenants, by name (tenants name their parent in
    # their `cohort`).
    cohorts: dict[str, CohortSettings] = {}

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_cohort_tree(self.cohorts)


class LogSettings(Section, frozen=True, kw_only=True):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


SignalProviderName = Literal[
    "static", "trace", "electricitymaps", "watttime", "uk-carbon-intensity", "carbon-aware-sdk"
]
LIVE_SIGNAL_PROVIDERS = ("electricitymaps", "watttime", "uk-carbon-intensity", "carbon-aware-sdk")
# Must match cloud.signals.forecast.FORECASTERS (a test checks): shared/ never imports cloud/.
ForecasterSetting = Literal[
    "persistence", "seasonal-naive", "seasonal-naive-weekly", "seasonal-blend", "profile-level"
]
EmissionFactorSetting = Literal["lifecycle", "direct"]


class StaticZoneSettings(Section, frozen=True, kw_only=True):
    """One row of `[signals] static_table`: `{ carbon_g_per_kwh = 120, price_per_mwh = 45 }`."""

    carbon_g_per_kwh: Annotated[float, msgspec.Meta(ge=0)]
    price_per_mwh: float | None = None
    currency: str = "USD"


def _check_http_url(key: str, url: str | None) -> None:
    if url is not None and not url.startswith(("http://", "https://")):
        raise FieldError(key, f"{url!r} must start with http:// or https://")


class SignalSettings(Section, frozen=True, kw_only=True):
    """Grid carbon intensity and price sources (cloud/signals, docs/signals.md)."""

    providers: tuple[SignalProviderName, ...] = ("trace",)
    cache_ttl_s: Annotated[float, msgspec.Meta(ge=0)] = 300.0
    staleness_limit_s: PositiveFloat = 3 * 3600.0
    history_hours: Annotated[int, msgspec.Meta(ge=1, le=24 * 31)] = 24
    forecast_horizon_hours: Annotated[int, msgspec.Meta(ge=1, le=24 * 14)] = 48
    forecaster: ForecasterSetting = "profile-level"
    rate_limit_backoff_s: PositiveFloat = 60.0
    auth_backoff_s: PositiveFloat = 900.0
    http_timeout_s: PositiveFloat = 10.0
    static_table: dict[str, StaticZoneSettings] = {}
    static_builtin: bool = True
    trace_dir: str | None = None  # None: the 2023 data shipped with greenfed
    trace_emission_factor: EmissionFactorSetting = "lifecycle"
    trace_replay_year: Annotated[int, msgspec.Meta(ge=1970, le=2100)] = 2023
    electricitymaps_token: str | None = None
    electricitymaps_base_url: str = "https://api.electricitymaps.com/v3"
    electricitymaps_emission_factor: EmissionFactorSetting = "lifecycle"
    watttime_username: str | None = None
    watttime_password: str | None = None
    watttime_base_url: str = "https://api.watttime.org"
    watttime_regions: dict[str, str] = msgspec.field(
        default_factory=lambda: {"US-CAL-CISO": "CAISO_NORTH"}
    )
    uk_base_url: str = "https://api.carbonintensity.org.uk"
    carbonaware_base_url: str | None = None
    carbonaware_locations: dict[str, str] = {}
    carbonaware_signal_type: Literal["average", "marginal"] = "marginal"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.providers:
            raise FieldError("providers", "name at least one provider")
        if len(set(self.providers)) != len(self.providers):
            raise FieldError("providers", f"{list(self.providers)} names a provider twice")
        live = [name for name in self.providers if name in LIVE_SIGNAL_PROVIDERS]
        if "trace" in self.providers and live:
            raise FieldError(
                "providers",
                "trace replays recorded time and cannot share a chain with live providers "
                f"({', '.join(live)})",
            )
        if "electricitymaps" in self.providers and not self.electricitymaps_token:
            raise FieldError(
                "electricitymaps_token", "required when providers include electricitymaps"
            )
        if "watttime" in self.providers and not (self.watttime_username and self.watttime_password):
            raise FieldError(
                "watttime_username",
                "watttime_username and watttime_password are required when providers include "
                "watttime",
            )
        if "carbon-aware-sdk" in self.providers and not self.carbonaware_base_url:
            raise FieldError(
                "carbonaware_base_url", "required when providers include carbon-aware-sdk"
            )
        for key in (
            "electricitymaps_base_url",
            "watttime_base_url",
            "uk_base_url",
            "carbonaware_base_url",
        ):
            _check_http_url(key, getattr(self, key))


# Must match cloud.store.engine's accepted schemes (a test checks): shared/ never imports cloud/.
DATABASE_URL_SCHEMES = (
    "sqlite",
    "sqlite+aiosqlite",
    "postgresql",
    "postgres",
    "postgresql+asyncpg",
)
_SQL_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class StoreSettings(Section, frozen=True, kw_only=True):
    """The control plane's durable store (cloud/store, docs/store.md)."""

    data_dir: str = ""  # empty: $XDG_DATA_HOME/greenfed, else ~/.local/share/greenfed
    database_url: str = ""  # empty: SQLite file greenfed.db in data_dir
    database_schema: str = ""  # PostgreSQL only; empty: the server's search_path
    sqlite_synchronous: Literal["normal", "full"] = "normal"
    busy_timeout_s: PositiveFloat = 5.0
    connect_timeout_s: PositiveFloat = 10.0
    pool_size: Annotated[int, msgspec.Meta(ge=1, le=100)] = 5
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=100)] = 3
    token_cache_s: Annotated[float, msgspec.Meta(ge=0)] = 60.0
    leader_poll_interval_s: PositiveFloat = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.database_url:
            scheme = self.database_url.partition("://")[0].lower()
            if "://" not in self.database_url or scheme not in DATABASE_URL_SCHEMES:
                raise FieldError(
                    "database_url",
                    "must start with sqlite:/// or postgresql:// "
                    f"(also {', '.join(DATABASE_URL_SCHEMES)})",
                )
        if self.database_schema:
            if not _SQL_IDENTIFIER.match(self.database_schema):
                raise FieldError(
                    "database_schema", f"{self.database_schema!r} must match [a-z_][a-z0-9_]*"
                )
            if not self.database_url.lower().startswith("postgres"):
                raise FieldError("database_schema", "only PostgreSQL databases have schemas")

    def resolved_data_dir(self, environ: Mapping[str, str] | None = None) -> Path:
        if self.data_dir:
            return Path(self.data_dir).expanduser()
        environ = os.environ if environ is None else environ
        base = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return Path(base) / "greenfed"


class UsageSettings(Section, frozen=True, kw_only=True):
    """Live accounting (cloud/usage/): energy, emissions and cost of every allocation."""

    enabled: bool = True
    # Metered usage is written to the store at most this often (one transaction).
    flush_interval_s: PositiveFloat = 10.0
    # A work item's final figures (its `work.usage` event) wait this long after it
    # ended, for its node's last telemetry.
    final_delay_s: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    # A telemetry gap longer than this is not filled by the model (the node was gone).
    max_gap_s: PositiveFloat = 6 * 3600.0


class Settings(Section, frozen=True, kw_only=True):
    mqtt: MqttSettings = MqttSettings()
    agent: AgentSettings = AgentSettings()
    cloud: CloudSettings = CloudSettings()
    log: LogSettings = LogSettings()
    signals: SignalSettings = SignalSettings()
    store: StoreSettings = StoreSettings()
    scheduling: SchedulingSettings = SchedulingSettings()
    usage: UsageSettings = UsageSettings()

    def check_fleet_reports_here(self) -> None:
        """Checks for a command whose agents report to the control plane of these same
        settings (`greenfed up`): a FieldError naming the agent's key its control plane
        would refuse in every birth. Not part of validation: an edge agent's file has a
        `[cloud]` table of defaults, not the limits of the control plane it reports to."""
        interval_s = self.agent.telemetry_interval_s
        low_s, high_s = self.cloud.min_telemetry_interval_s, self.cloud.max_telemetry_interval_s
        if not low_s <= interval_s <= high_s:
            raise FieldError(
                ("agent", "telemetry_interval_s"),
                f"{interval_s} s is outside [cloud.min_telemetry_interval_s, "
                f"cloud.max_telemetry_interval_s] = [{low_s}, {high_s}]: the control plane "
                "would refuse every node's birth and telemetry",
            )


def _describe(error: msgspec.ValidationError) -> tuple[FieldPath, str]:
    """(path of the key at fault, from the section down; the reason) of a validation error."""
    refused = FieldError.from_msgspec(error)
    if isinstance(refused, UnknownFieldError):
        return refused.path, "unknown key"
    if isinstance(refused, MissingFieldError):  # said of the table, in msgspec's words
        return refused.path[:-1], str(refused)
    return refused.path, refused.reason


# A table key that reads unambiguously after a dot; any other is quoted, as in TOML.
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _name_mapping_keys(raw: Any, path: FieldPath, reason: str) -> FieldPath:
    """`path` with each `...` (msgspec's word for "a value of this table", whose key it
    does not report: `scheduling.cohorts[...].parnt`) replaced by the key at fault.

    The key is found by validating the document again with that table cut down to one
    entry at a time: the entry that alone gives the same error is the one. Where none
    does (an error about entries together) or the document is not as the path says,
    `...` stays."""
    named = list(path)
    lookup = list(path)  # the path with the raw keys found so far, to walk the document
    for where, step in enumerate(path):
        if step is not ...:
            continue
        table = _at(raw, tuple(lookup[:where]))
        if not isinstance(table, dict):
            break
        for key, value in table.items():
            trial = _with(raw, tuple(lookup[:where]), {key: value})
            try:
                msgspec.convert(trial, Settings)
            except msgspec.ValidationError as error:
                if _describe(error) == (path, reason):
                    raw = trial
                    lookup[where] = key
                    named[where] = key if _BARE_KEY.match(key) else f'"{key}"'
                    break
        else:
            break
    return tuple(named)


def _at(document: Any, path: FieldPath) -> Any:
    """The value at `path` in a raw (TOML) document; None where there is none."""
    for step in path:
        if isinstance(document, dict) and isinstance(step, str):
            document = document.get(step)
        elif isinstance(document, list) and isinstance(step, int) and step < len(document):
            document = document[step]
        else:
            return None
    return document


def _with(document: Any, path: FieldPath, value: Any) -> Any:
    """A copy of `document` with `value` at `path` (which `_at` found), the rest shared."""
    if not path:
        return value
    step, rest = path[0], path[1:]
    if isinstance(document, dict):
        return {**document, step: _with(document[step], rest, value)}
    # A list and an index here, as `_at` walked it.
    assert isinstance(document, list)
    assert isinstance(step, int)
    copy = list(document)
    copy[step] = _with(document[step], rest, value)
    return copy


def _section_field_type(section: str, key: str) -> Any:
    section_fields = {f.name: f for f in msgspec.structs.fields(Settings)}
    if section not in section_fields:
        raise ConfigError(f"unknown settings section {section!r}", key=section)
    section_type = section_fields[section].type
    key_fields = {f.name: f.type for f in msgspec.structs.fields(section_type)}
    if key not in key_fields:
        raise ConfigError(f"unknown key {section}.{key}", key=f"{section}.{key}")
    return key_fields[key]


def _env_value(raw: str, field_type: Any) -> Any:
    """Take the text as-is where the field accepts it, else read it as a TOML value."""
    try:
        msgspec.convert(raw, field_type)
    except msgspec.ValidationError:
        pass
    else:
        return raw
    try:
        return tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return raw


def env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    overrides: dict[str, dict[str, Any]] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or ENV_SEPARATOR not in name:
            continue
        section, _, key = name[len(ENV_PREFIX) :].lower().partition(ENV_SEPARATOR)
        try:
            field_type = _section_field_type(section, key)
        except ConfigError as error:
            raise ConfigError(f"environment variable {name}: {error}", key=error.key) from None
        overrides.setdefault(section, {})[key] = _env_value(raw, field_type)
    return overrides


def env_variable(section: str, key: str) -> str:
    """The environment variable that sets `section.key`."""
    return f"{ENV_PREFIX}{section.upper()}{ENV_SEPARATOR}{key.upper()}"


def setting_origin(
    key: str,
    *,
    source: str,
    env: Mapping[str, Mapping[str, Any]],
    options: Mapping[str, str],
) -> str:
    """Where the value at the dotted `key` came from: the command-line option that set
    it (`options` maps `section.key` to it), the environment variable (`env`, as
    `env_overrides` read them), or else `source` (the file, or "defaults")."""
    section, _, rest = key.partition(".")
    field_name = rest.partition(".")[0]
    option = options.get(f"{section}.{field_name}")
    if option is not None:
        return option
    if field_name in env.get(section, {}):
        return f"environment variable {env_variable(section, field_name)}"
    return source


def read_toml_file(path: Path, kind: str = "config file") -> dict[str, Any]:
    """A TOML file's tables, or a `ConfigError` that says what is wrong with the file
    (`kind` names it: "config file", "fleet file")."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{kind} {path} does not exist") from None
    except OSError as error:  # a directory, no permission, an I/O error
        raise ConfigError(f"{kind} {path} cannot be read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        line = error.object[: error.start].count(b"\n") + 1
        raise ConfigError(
            f"{kind} {path} is not UTF-8 text (line {line}): TOML files are UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{kind} {path} is not valid TOML: {error}") from None
    except RecursionError:
        raise ConfigError(f"{kind} {path}: TOML nested too deeply to read") from None


def load_settings(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    option_names: Mapping[str, str] | None = None,
) -> Settings:
    """Read the TOML file (if any), apply environment overrides and then `options`
    (`{section: {key: value}}`: command-line options, each named in `option_names` by
    its `section.key`), and validate everything once. A refused value is a ConfigError
    that names the key and where it came from."""
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        raw = read_toml_file(path)
    overrides = env_overrides(environ)
    for layer in (overrides, options or {}):
        for section, values in layer.items():
            current = raw.get(section, {})
            if not isinstance(current, dict):
                raise ConfigError(f"{source}: key {section} must be a table", key=section)
            raw[section] = {**current, **values}
    try:
        return msgspec.convert(raw, Settings)
    except msgspec.ValidationError as error:
        key_path, reason = _describe(error)
        key_path = _name_mapping_keys(raw, key_path, reason)
        key = dotted_path(key_path)
        origin = setting_origin(key, source=source, env=overrides, options=option_names or {})
        raise ConfigError(f"{origin}: {key or 'settings'}: {reason}", key=key or None) from None
