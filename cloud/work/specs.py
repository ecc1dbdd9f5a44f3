"""The REST contract for work: what a tenant writes to submit a training job or a deployment.

Frozen msgspec Structs with `forbid_unknown_fields`: a typo in a field name is an error
that names it, never a silently ignored setting. The same types decode `POST /v1/jobs`
and `POST /v1/deployments`, the CLI's JSON/TOML/YAML spec files, and the spec the store
keeps; their JSON Schemas are published in `/openapi.json`. `cloud.work.convert` turns
them into the scheduler's `TrainingJob` / `InferenceDeployment`.

Cross-field rules live in `__post_init__` and raise `shared.errors.FieldError` (the field
and the reason, as data); `describe_error` turns a decode error, ours or msgspec's own,
into the path of the field at fault (``$.workers``, ``$.affinity[0].values``) and why.

A training job's secrets (`secret_env` values, `registry_auth.password`) have two forms
in one type: plaintext as submitted, ciphertext as stored (cloud/secrets/at_rest.py
encrypts them before the spec is encoded). Their plaintext sizes are checked where the
plaintext is known (`check_submitted_secrets`, at submission and in spec files, with
their names); the schema bounds each value loosely enough for its stored form.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Final, Literal

import msgspec

from cloud.work.array_ranges import MAX_ARRAY_INDEX, MAX_ARRAY_TASKS, MAX_ARRAY_TEXT, parse_array
from shared.errors import FieldError, json_path, worded_pattern
from shared.images import registry_of
from shared.messages import KERNEL_PIDS_MAX, AcceleratorKind, ImagePullPolicy, LaunchMode, Site
from shared.mig_profiles import MIG_PROFILE_PATTERN
from shared.root_sensitive_env import is_root_sensitive
from shared.taints import CORDON_TAINT_KEY
from shared.work_literals import (
    DeadlinePolicy,
    DependencyCondition,
    GangTopology,
    IsolationRequirement,
    LabelOperator,
    PriorityClass,
    SpecKind,
)
from shared.worker_env import ARRAY_VARIABLES, RUNNER_VARIABLES

GIB: Final = 1024**3

# "(?!\n)": Python's $ also matches before a final newline; JSON Schema's (ECMA) never does.
# Each pattern is worded (shared/errors.py): a refusal says what it takes, not the regex.
_NAME_PATTERN: Final = worded_pattern(
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$(?!\n)",
    "must be letters, digits, '.', '_' and '-', starting with a letter or digit; at most "
    "128 characters",
)
Name = Annotated[
    str,
    msgspec.Meta(
        pattern=_NAME_PATTERN,
        description="Letters, digits, '.', '_' and '-'; at most 128 characters.",
    ),
]
LabelKey = Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
LabelValue = Annotated[str, msgspec.Meta(max_length=253)]
EnvName = Annotated[
    str,
    msgspec.Meta(
        pattern=worded_pattern(
            r"^[A-Za-z_][A-Za-z0-9_]{0,255}$(?!\n)",
            "must be a variable name: letters, digits and '_', not starting with a digit; "
            "at most 256 characters",
        ),
        description="A variable name: letters, digits and '_', not starting with a digit.",
    ),
]
GroupName = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
Gib = Annotated[float, msgspec.Meta(ge=0, le=1024 * 1024, description="Gibibytes (2**30 bytes).")]
Weight = Annotated[float, msgspec.Meta(ge=0, le=1e6)]
MigProfile = Annotated[
    str,
    msgspec.Meta(
        pattern=worded_pattern(
            MIG_PROFILE_PATTERN, "must be a MIG profile: <1-7>g.<memory>gb, e.g. 1g.10gb"
        ),
        description=(
            "Each accelerator is a MIG slice of this profile (e.g. 1g.10gb), never a whole "
            "GPU; GPUs only."
        ),
    ),
]
Seconds = Annotated[float, msgspec.Meta(ge=0)]
StartWindowText = Annotated[
    str,
    msgspec.Meta(
        pattern=worded_pattern(
            r"^([01][0-9]|2[0-3]):[0-5][0-9]-([01][0-9]|2[0-3]):[0-5][0-9]$(?!\n)",
            "must be HH:MM-HH:MM, two 24-hour times, e.g. 20:00-06:00",
        ),
        description=(
            "HH:MM-HH:MM in the node's local time, e.g. 20:00-06:00 (may wrap midnight); "
            "the job starts only inside it."
        ),
        examples=["20:00-06:00"],
    ),
]
Deadline = Annotated[
    datetime,
    msgspec.Meta(tz=True, description="RFC 3339 time by which the job must have finished."),
]

# Every id greenfed gives (jobs, deployments, models): one pattern, one wording.
ID_PATTERN: Final = worded_pattern(
    r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$(?!\n)",
    "must be an id as greenfed gives them (a ULID: 26 digits and upper-case letters)",
)
WorkId = Annotated[
    str,
    msgspec.Meta(
        pattern=ID_PATTERN, description="A job's id (a ULID), as POST /v1/jobs returned it."
    ),
]

# Plain variables: at most this many per job (a job array's tasks get theirs among them).
MAX_ENV_VARIABLES: Final = 1024
# Secrets: at most this many per job, each value and all of them together at most this
# many bytes of plaintext as it is sealed into a node's `desired` document (UTF-8,
# JSON-escaped: a control character takes 6 bytes there), so that a job's secrets alone
# never outgrow that document (cloud/loop/desired.py); a registry password at most its
# own limit.
MAX_SECRETS: Final = 256
MAX_SECRET_BYTES: Final = 64 * 1024
MAX_REGISTRY_PASSWORD_BYTES: Final = 4096
# The schema's bound on one value, in characters: room for the stored form of the
# largest plaintext too (encryption at rest makes it about a third longer).
_STORED_SECRET_CHARS: Final = 96 * 1024
_STORED_PASSWORD_CHARS: Final = 8 * 1024

# An OCI image reference as container runtimes take it (distribution/reference's
# grammar, IPv6 registries aside): [registry[:port]/]path[:tag][@digest], e.g.
# ghcr.io/acme/trainer:2.1, pytorch/pytorch@sha256:<hex>, localhost:5000/job.
_DOMAIN_LABEL: Final = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_REGISTRY: Final = rf"{_DOMAIN_LABEL}(?:\.{_DOMAIN_LABEL})*(?::[0-9]{{1,5}})?"
_PATH_COMPONENT: Final = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG: Final = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST: Final = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_IMAGE: Final = (
    rf"(?:{_REGISTRY}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?"
)
# Nodes get it with its registry spelled out (shared/images.py `qualified`, at most 18
# characters more) within the wire's 512 (shared/messages.py DesiredTraining.image).
_IMAGE_MAX_CHARS: Final = 512 - len("docker.io/library/")
ImageReference = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=_IMAGE_MAX_CHARS,
        # Published, but checked by TrainingJobSpec (`image_reference_fault`), which can
        # say which part is wrong where a pattern only says "no".
        extra_json_schema={"pattern": rf"^{_IMAGE}$(?!\n)"},
        description=(
            "An OCI image reference, [registry[:port]/]path[:tag][@digest], e.g. "
            "ghcr.io/acme/trainer:2.1; without a registry, docker.io."
        ),
        examples=["ghcr.io/acme/trainer:2.1"],
    ),
]
RegistryHost = Annotated[
    str,
    msgspec.Meta(
        max_length=260,
        pattern=worded_pattern(
            rf"^{_REGISTRY}$(?!\n)",
            "must be a registry's host name, with a port or not, e.g. ghcr.io or localhost:5000",
        ),
        description="Host[:port] of a registry, e.g. ghcr.io.",
    ),
]


def image_reference_fault(image: str) -> str | None:
    """None for a well-formed image reference; else why not, naming the part at fault
    where it can be told (upper case in the path is the usual mistake)."""
    if re.fullmatch(_IMAGE, image):
        return None
    return (
        "not an OCI image reference ([registry[:port]/]path[:tag][@digest]): "
        + _image_part_at_fault(image)
    )


def _image_part_at_fault(image: str) -> str:
    if any(character.isspace() or not character.isprintable() for character in image):
        return "it holds whitespace or a control character"
    name, at_sign, digest = image.partition("@")
    if at_sign and re.fullmatch(_DIGEST, digest) is None:
        return "the digest after '@' must be <algorithm>:<hex digits>, e.g. sha256:<64 hex>"
    head, slash, last = name.rpartition("/")
    last, colon, tag = last.partition(":")  # past the last '/': a registry's port is not
    if colon and re.fullmatch(_TAG, tag) is None:
        return (
            "the tag after ':' must be letters, digits, '_', '.' and '-', not starting "
            "with '.' or '-'; at most 128 characters"
        )
    parts = [*head.split("/"), last] if slash else [last]
    # The first part names a registry where a runtime reads it so (shared/images.py).
    if slash and registry_of(name) == parts[0]:
        if re.fullmatch(_REGISTRY, parts[0]) is None:
            return "the registry must be a host name, with a port or not, e.g. ghcr.io:443"
        parts = parts[1:]
    if "" in parts:
        return "the path has an empty part ('//', or a '/' at an end)"
    if any(part != part.lower() for part in parts):
        return "the path must be lower case"
    return (
        "each part of the path between '/' must be lower-case letters and digits, "
        "joined by '.', '_', '__' or '-'"
    )


class SpecStruct(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every spec type: immutable, keyword-only, unknown fields rejected."""


# A job named as a person knows it: resolved to its id when the spec is submitted
# (cloud/api/references.py), so the stored spec holds ids only.
JobReference = Annotated[
    str,
    msgspec.Meta(
        pattern=_NAME_PATTERN,
        description="A job's id (a ULID), or the name or a unique id prefix of one of the "
        "tenant's jobs: replaced by its id at submission.",
    ),
]


class DependencySpec(SpecStruct, frozen=True, kw_only=True):
    """Start only once another of the tenant's training jobs has ended this way
    (docs/rest.md#dependencies): `succeeded`, `failed`, or `ended` (either, or cancelled).
    A dependency that can no longer hold cancels the dependent."""

    job: JobReference
    condition: DependencyCondition = "succeeded"


def _check_dependencies(depends_on: tuple[DependencySpec, ...]) -> None:
    seen: set[str] = set()
    for index, dependency in enumerate(depends_on):
        if dependency.job in seen:
            raise FieldError(("depends_on", index, "job"), f"names job {dependency.job} twice")
        seen.add(dependency.job)


DependsOn = Annotated[
    tuple[DependencySpec, ...],
    msgspec.Meta(
        max_length=64,
        description=(
            "Training jobs that must have ended (each as its condition says) before this "
            "starts; it waits with pending reason `dependency` until then."
        ),
    ),
]
AllowUnschedulable = Annotated[
    bool,
    msgspec.Meta(
        description=(
            "Accept it although no node registered now could ever run it (a fleet that "
            "will grow): it waits with pending reason `unschedulable` naming the cause."
        ),
    ),
]


class LabelRequirementSpec(SpecStruct, frozen=True, kw_only=True):
    """Node affinity (`In`, `Exists`) or anti-affinity (`NotIn`, `DoesNotExist`) on a label."""

    key: LabelKey
    operator: LabelOperator
    values: Annotated[tuple[LabelValue, ...], msgspec.Meta(max_length=64)] = ()

    def __post_init__(self) -> None:
        needs_values = self.operator in ("In", "NotIn")
        if needs_values and not self.values:
            raise FieldError("values", f"operator {self.operator} needs at least one value")
        if not needs_values and self.values:
            raise FieldError("values", f"operator {self.operator} takes no values")


class TolerationSpec(SpecStruct, frozen=True, kw_only=True):
    """Tolerates node taints with this key (and this value; none: any value)."""

    key: LabelKey
    value: LabelValue | None = None

    def __post_init__(self) -> None:
        if self.key == CORDON_TAINT_KEY:
            raise FieldError(
                "key", f"{CORDON_TAINT_KEY} marks a cordoned node: no work tolerates it"
            )


class BatchingSpec(SpecStruct, frozen=True, kw_only=True):
    """Dynamic batching on the serving agents (docs/inference.md)."""

    max_batch_size: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 1
    # The longest a request waits for others to batch with: the wire's and the agent's
    # max_queue_delay; REST and spec files spell it max_wait_ms.
    max_queue_delay_ms: Annotated[float, msgspec.Meta(ge=0, le=10_000)] = msgspec.field(
        default=0.0, name="max_wait_ms"
    )


# Placement fields training jobs and deployments share (each with its own default).
Sites = Annotated[tuple[Site, ...], msgspec.Meta(min_length=1, max_length=2)]
NodeSelector = Annotated[
    dict[LabelKey, LabelValue],
    msgspec.Meta(
        max_length=64, description="Labels a node must carry, all of them (exact values)."
    ),
]
Affinity = Annotated[tuple[LabelRequirementSpec, ...], msgspec.Meta(max_length=64)]
Tolerations = Annotated[tuple[TolerationSpec, ...], msgspec.Meta(max_length=64)]
Group = Annotated[GroupName | None, msgspec.Meta(description="A name other work can avoid.")]
AntiAffinityGroups = Annotated[
    tuple[GroupName, ...],
    msgspec.Meta(max_length=64, description="Never share a node with work of these groups."),
]
ScoreWeights = Annotated[
    dict[Annotated[str, msgspec.Meta(min_length=1, max_length=64)], Weight],
    msgspec.Meta(
        max_length=64,
        description=(
            "Per-job weights of the scoring terms (carbon, price, latency, packing, load, "
            "speed, preference, spread; extension terms x-...), overriding the policy's."
        ),
    ),
]


class RegistryAuthSpec(SpecStruct, frozen=True, kw_only=True):
    """Credentials that pull a training job's `image` from a private registry. The
    password is a secret: encrypted at rest, sealed to the node that pulls the image,
    never shown."""

    registry: Annotated[
        RegistryHost | None,
        msgspec.Meta(description="Default: the registry of the job's image (docker.io if none)."),
    ] = None
    # Printable: shown to admins (`greenfed job`), where a control character would be
    # a terminal escape sequence; no registry login holds one.
    username: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            max_length=256,
            pattern=worded_pattern(
                r"^[^\x00-\x1f\x7f-\x9f]+$(?!\n)", "must be printable: no control characters"
            ),
        ),
    ]
    password: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            max_length=_STORED_PASSWORD_CHARS,
            description=f"A secret; at most {MAX_REGISTRY_PASSWORD_BYTES} bytes.",
        ),
    ]


class ArrayTaskSpec(SpecStruct, frozen=True, kw_only=True):
    """Which task of a job array this job is (docs/rest.md#job-arrays): set by greenfed
    on every task it creates from an `array`; a submission never carries it."""

    array_id: WorkId
    array: Annotated[str, msgspec.Meta(max_length=MAX_ARRAY_TEXT)]  # as submitted
    index: Annotated[int, msgspec.Meta(ge=0, le=MAX_ARRAY_INDEX)]
    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_ARRAY_TASKS)]
    throttle: Annotated[int, msgspec.Meta(ge=1)] | None = None


class GangShapeSpec(SpecStruct, frozen=True, kw_only=True):
    """Another gang shape a training job runs as well in (flexible shapes): `workers`
    workers of `accelerators_per_worker` devices, the job's total of devices."""

    workers: Annotated[int, msgspec.Meta(ge=1, le=1024)]
    accelerators_per_worker: Annotated[int, msgspec.Meta(ge=1, le=64)]


class TrainingJobSpec(SpecStruct, frozen=True, kw_only=True):
    """A training job: a gang of `workers`, all placed at once on cloud nodes, or none."""

    kind: Annotated[
        Literal["training"], msgspec.Meta(description="Optional; spec files use it.")
    ] = "training"
    name: Name
    priority: Annotated[PriorityClass, msgspec.Meta(description="p0 > p1 > p2.")] = "p1"
    workers: Annotated[int, msgspec.Meta(ge=1, le=1024, description="Gang size.")] = 1
    accelerators_per_worker: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    alternative_shapes: Annotated[
        tuple[GangShapeSpec, ...],
        msgspec.Meta(
            max_length=4,
            description=(
                "Other gang shapes it runs as well in (data-parallel), e.g. 2 workers of 4 "
                "for 1 of 8: each with the same total of accelerators (so "
                "estimated_duration_s, given for workers x accelerators_per_worker, holds "
                "for each), distinct, at most 4. The scheduler picks the shape whose "
                "placement scores best; the worker environment (WORLD_SIZE, "
                "LOCAL_WORLD_SIZE, CUDA_VISIBLE_DEVICES, ...) follows the shape it runs in."
            ),
        ),
    ] = ()
    accelerator_kind: AcceleratorKind = "gpu"
    memory_gib: Annotated[Gib, msgspec.Meta(description="Memory per accelerator, at least.")] = 0.0
    host_memory_gib: Annotated[Gib, msgspec.Meta(description="Host memory per worker.")] = 0.0
    cpus_per_worker: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=4096,
            description=(
                "CPU cores per worker beside its GPUs or NPUs (data loaders), held on the "
                "node while it runs; a cpu job asks for cores with accelerators_per_worker."
            ),
        ),
    ] = 0
    accelerator_models: Annotated[
        tuple[Annotated[str, msgspec.Meta(min_length=1)], ...],
        msgspec.Meta(max_length=64, description="Accepted accelerator models; empty: any."),
    ] = ()
    mig_profile: MigProfile | None = None
    estimated_duration_s: Annotated[
        float,
        msgspec.Meta(
            gt=0, le=365 * 86400.0, description="Expected run time on one A100 (speed 1.0)."
        ),
    ] = 3600.0
    preemptible: bool = True
    start_window: StartWindowText | None = None
    deadline: Deadline | None = None
    on_deadline_missed: Annotated[
        DeadlinePolicy,
        msgspec.Meta(
            description=(
                "While it waits and the deadline can no longer be met on any registered "
                "node: fail it (fail), or let it wait, pending as unschedulable (keep)."
            ),
        ),
    ] = "fail"
    max_delay_s: Annotated[
        Seconds | None,
        msgspec.Meta(description="The job may start up to this long after submission."),
    ] = None
    checkpoint_interval_s: Annotated[
        Annotated[float, msgspec.Meta(gt=0, le=86400.0)] | None,
        msgspec.Meta(
            description=(
                "The job saves a checkpoint at least this often (seconds) and a restarted "
                "worker (GREENFED_ATTEMPT > 1) resumes from the newest one, so greenfed may "
                "move it to cleaner capacity while it runs. Omit if it starts over."
            ),
        ),
    ] = None
    topology: Annotated[
        GangTopology,
        msgspec.Meta(
            description=(
                "Where the workers of a gang (workers > 1) must all be: one region "
                "(default), one zone, one rack (node label rack), or any."
            ),
        ),
    ] = "region"
    command: Annotated[
        tuple[Annotated[str, msgspec.Meta(max_length=65536)], ...],
        msgspec.Meta(min_length=1, max_length=4096, description="argv; run without a shell."),
    ]
    env: Annotated[
        dict[EnvName, str],
        msgspec.Meta(
            max_length=MAX_ENV_VARIABLES,
            description=(
                "Plain variables for every worker: NOT secret (shown in every view of the "
                "job and sent to nodes as they are); use secret_env for secrets."
            ),
        ),
    ] = {}
    secret_env: Annotated[
        dict[EnvName, Annotated[str, msgspec.Meta(max_length=_STORED_SECRET_CHARS)]],
        msgspec.Meta(
            max_length=MAX_SECRETS,
            description=(
                "Secret variables for every worker: encrypted at rest, sealed to the node "
                "that runs the worker, shown by name only. At most 64 KiB of values, "
                "JSON-escaped."
            ),
        ),
    ] = {}
    # No whitespace or control characters: the path reaches a cluster's records
    # (`scontrol -o` prints it as `WorkDir=<path>` among its `Key=Value` pairs).
    working_dir: (
        Annotated[
            str,
            msgspec.Meta(
                min_length=1,
                max_length=4096,
                pattern=worded_pattern(
                    r"^[^\s\x00-\x1f\x7f-\x9f]+$(?!\n)",
                    "must have no whitespace or control characters",
                ),
            ),
        ]
        | None
    ) = None
    image: Annotated[
        ImageReference | None,
        msgspec.Meta(description="Run the command in this OCI image; null: on the node itself."),
    ] = None
    image_pull_policy: Annotated[
        ImagePullPolicy,
        msgspec.Meta(description="if-not-present, always (pull every start) or never."),
    ] = "if-not-present"
    registry_auth: Annotated[
        RegistryAuthSpec | None,
        msgspec.Meta(description="Credentials for a private registry (needs image)."),
    ] = None
    isolation: Annotated[
        IsolationRequirement,
        msgspec.Meta(
            description=(
                "The least isolation the job accepts from its nodes (none < user < "
                "sandbox; the cluster's scheduling.min_isolation may ask for more)."
            )
        ),
    ] = "none"
    launch: Annotated[
        LaunchMode,
        msgspec.Meta(
            description=(
                "per-worker: one process per worker (RANK, LOCAL_RANK each); per-node: "
                "one process per node that starts its workers itself (torchrun)."
            )
        ),
    ] = "per-worker"
    pids_limit: Annotated[
        Annotated[int, msgspec.Meta(ge=16, le=KERNEL_PIDS_MAX)] | None,
        msgspec.Meta(description="Processes and threads per worker; null: the node's default."),
    ] = None
    grace_period_s: Annotated[
        float, msgspec.Meta(ge=0, le=3600, description="From SIGTERM to SIGKILL on stop.")
    ] = 30.0
    max_retries: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=100,
            description=(
                "Times a failed job (a worker that exits non-zero or cannot start) is run "
                "again before it fails; counted apart from lost nodes and preemptions."
            ),
        ),
    ] = 0
    retry_backoff_s: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            le=86400,
            description="Wait before the first retry; doubled for each further one, to 1 h.",
        ),
    ] = 30.0
    sites: Sites = ("cloud",)
    node_selector: NodeSelector = {}
    affinity: Affinity = ()
    tolerations: Tolerations = ()
    group: Group = None
    anti_affinity_groups: AntiAffinityGroups = ()
    score_weights: ScoreWeights = {}
    depends_on: DependsOn = ()
    allow_unschedulable: AllowUnschedulable = False
    array: Annotated[
        Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ARRAY_TEXT)] | None,
        msgspec.Meta(
            description=(
                "Run it as a job array (Slurm's --array): one task per index, e.g. "
                "0-99%10 (tasks 0..99, at most 10 placed at once), 1,3,5-7 or 0-15:4; "
                f"at most {MAX_ARRAY_TASKS} tasks. Each task is a job of its own with "
                "GREENFED_ARRAY_TASK_ID in its env."
            ),
            examples=["0-99%10"],
        ),
    ] = None
    array_task: Annotated[
        ArrayTaskSpec | None,
        msgspec.Meta(description="Set by greenfed on each task of an array; never submitted."),
    ] = None

    def __post_init__(self) -> None:
        if self.image is not None and (fault := image_reference_fault(self.image)):
            raise FieldError("image", fault)
        if self.array is not None:
            parse_array(self.array)  # a FieldError on `array` says what is wrong
        array_variables = sorted(ARRAY_VARIABLES.intersection(self.env))
        if array_variables and self.array_task is None:  # a task's own are greenfed's
            raise FieldError("env", _set_by_greenfed(array_variables))
        reserved = sorted(RUNNER_VARIABLES.intersection(self.env))
        if reserved:
            raise FieldError("env", _set_by_greenfed(reserved))
        for name in sorted(self.secret_env):
            if name in RUNNER_VARIABLES or name in ARRAY_VARIABLES:
                raise FieldError(("secret_env", name), _set_by_greenfed([name]))
            if name in self.env:
                raise FieldError(
                    ("secret_env", name), f"{name} is in env too: a variable is plain or secret"
                )
        if self.registry_auth is not None and self.image is None:
            raise FieldError("registry_auth", "pulls an image from a registry: name the image")
        if len(set(self.sites)) != len(self.sites):
            raise FieldError("sites", "names a site twice")
        if self.cpus_per_worker and self.accelerator_kind == "cpu":
            raise FieldError(
                "cpus_per_worker",
                "a cpu job's cores are its accelerators_per_worker; cpus_per_worker is for "
                "gpu and npu jobs",
            )
        _check_dependencies(self.depends_on)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def host_memory_bytes(self) -> int:
        return int(self.host_memory_gib * GIB)

    @property
    def has_secrets(self) -> bool:
        """It carries secrets for its workers: secret_env values or a registry password."""
        return bool(self.secret_env) or self.registry_auth is not None

    def image_registry(self) -> str | None:
        """The registry its registry_auth logs in to (None: it has no registry_auth)."""
        auth = self.registry_auth
        if auth is None or self.image is None:
            return None
        return auth.registry or registry_of(self.image)


def _set_by_greenfed(names: list[str]) -> str:
    verb = "is" if len(names) == 1 else "are"
    return (
        f"{', '.join(names)} {verb} set by greenfed for each worker "
        "(docs/rest.md#the-worker-environment)"
    )


def check_submitted_secrets(spec: TrainingJobSpec) -> None:
    """The spec's secrets can be kept secret on a node and their plaintext is within its
    limits, or a FieldError naming the one at fault. Only for a spec as submitted: a
    stored one holds ciphertext (and a job stored before a rule was added still runs)."""
    for name in sorted(spec.secret_env):
        if is_root_sensitive(name):
            raise FieldError(
                ("secret_env", name),
                f"{name} changes what the node's root programs do, so it reaches the "
                "worker as an argument other users of the node can read: pass it in env",
            )
    total = 0
    for name, value in spec.secret_env.items():
        size = len(msgspec.json.encode(value)) - len('""')  # as sealed: JSON-escaped
        if size > MAX_SECRET_BYTES:
            raise FieldError(
                ("secret_env", name),
                f"has {size} bytes JSON-escaped (a control character takes 6); a value "
                f"has at most {MAX_SECRET_BYTES}",
            )
        total += size
        if total > MAX_SECRET_BYTES:
            raise FieldError(
                ("secret_env", name),
                f"brings the values to {total} bytes; together they have at most "
                f"{MAX_SECRET_BYTES}",
            )
    auth = spec.registry_auth
    if auth is not None and len(auth.password.encode()) > MAX_REGISTRY_PASSWORD_BYTES:
        raise FieldError(
            ("registry_auth", "password"), f"has more than {MAX_REGISTRY_PASSWORD_BYTES} bytes"
        )


class CarbonCapSpec(SpecStruct, frozen=True, kw_only=True):
    """At or above this grid intensity, at most this many replicas (carbon-aware KEDA)."""

    above_g_per_kwh: Annotated[float, msgspec.Meta(ge=0, le=10_000)]
    max_replicas: Annotated[int, msgspec.Meta(ge=1, le=4096)]


class AutoscaleSpec(SpecStruct, frozen=True, kw_only=True):
    """Replicas that follow the load, with the Kubernetes HPA's rule (docs/inference.md):
    desired = ceil(current × observed per replica / target), unchanged within
    `tolerance`; scaling up takes the lowest recommendation of the last
    `scale_up_stabilization_s`, scaling down the highest of the last
    `scale_down_stabilization_s`; at most `max_step` replicas per decision."""

    min_replicas: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 1
    max_replicas: Annotated[int, msgspec.Meta(ge=1, le=4096)]
    target_requests_per_s: (
        Annotated[float, msgspec.Meta(gt=0, le=1e9, description="Per replica.")] | None
    ) = None
    target_p95_latency_ms: (
        Annotated[float, msgspec.Meta(gt=0, le=3_600_000, description="Per replica.")] | None
    ) = None
    scale_up_stabilization_s: Annotated[float, msgspec.Meta(ge=0, le=86_400)] = 0.0
    scale_down_stabilization_s: Annotated[float, msgspec.Meta(ge=0, le=86_400)] = 300.0
    tolerance: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.1
    max_step: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 4
    max_replicas_by_carbon: Annotated[
        tuple[CarbonCapSpec, ...],
        msgspec.Meta(
            max_length=16,
            description=(
                "Caps while the grid where the replicas run is dirty; never below "
                "min_replicas, and lifted while p95 latency breaks latency_slo_ms."
            ),
        ),
    ] = ()

    def __post_init__(self) -> None:
        if self.max_replicas < self.min_replicas:
            raise FieldError("max_replicas", f"must be >= min_replicas ({self.min_replicas})")
        if (self.target_requests_per_s is None) == (self.target_p95_latency_ms is None):
            raise FieldError(
                "target_requests_per_s", "give exactly one of it and target_p95_latency_ms"
            )

    def expected_requests_per_s(self, replicas: int) -> float | None:
        """The load `replicas` carry when the autoscaler keeps each near its request-rate
        target (None: it scales on latency, which says nothing of the rate)."""
        if self.target_requests_per_s is None:
            return None
        return self.target_requests_per_s * replicas


class CanarySpec(SpecStruct, frozen=True, kw_only=True):
    """A model rollout in progress (docs/inference.md#canary-rollouts): `model_id` serves
    on `replicas` canary replicas while the rest keep the deployment's model; promoted
    when healthy for `hold_s`, rolled back when a gate is breached."""

    model_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    replicas: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 1
    hold_s: Annotated[float, msgspec.Meta(ge=0, le=86_400)] = 60.0
    max_error_rate: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.01
    # The canary's p95 latency against the other replicas'.
    max_p95_ratio: Annotated[float, msgspec.Meta(ge=1, le=100)] = 1.5
    # Requests the canary must have answered before its error rate is judged.
    min_requests: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 20


# `replicas` not given (a value decoding never yields: it is below the minimum of 1).
_REPLICAS_UNSET: Final = 0


class DeploymentSpec(SpecStruct, frozen=True, kw_only=True):
    """An inference deployment: `replicas` ONNX model servers, on edge nodes by default."""

    kind: Annotated[
        Literal["deployment"], msgspec.Meta(description="Optional; spec files use it.")
    ] = "deployment"
    name: Name
    model_id: Annotated[
        str,
        msgspec.Meta(
            min_length=1, max_length=64, description="The model to serve: an id from /v1/models."
        ),
    ]
    priority: Annotated[PriorityClass, msgspec.Meta(description="p0 > p1 > p2.")] = "p0"
    replicas: Annotated[
        int,
        msgspec.Meta(
            ge=1, le=4096, description="Default: autoscale's min_replicas with autoscale, else 1."
        ),
    ] = _REPLICAS_UNSET
    min_replicas: Annotated[
        int | None,
        msgspec.Meta(description="Accept a partial placement of at least this many replicas."),
    ] = None
    min_available: (
        Annotated[
            int,
            msgspec.Meta(
                ge=0,
                le=4096,
                description=(
                    "Replicas kept serving through drains, preemption and rollouts (a "
                    "disruption budget); at most replicas, and at most autoscale's "
                    "min_replicas."
                ),
            ),
        ]
        | None
    ) = None
    accelerators_per_replica: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    accepted_kinds: Annotated[
        tuple[AcceleratorKind, ...],
        msgspec.Meta(min_length=1, max_length=3, description="In order of preference."),
    ] = ("npu", "gpu", "cpu")
    providers: Annotated[
        tuple[Annotated[str, msgspec.Meta(min_length=1, max_length=128)], ...],
        msgspec.Meta(
            max_length=16,
            description="ONNX Runtime execution providers in order of preference; empty: any.",
        ),
    ] = ()
    memory_gib: Annotated[Gib, msgspec.Meta(description="Model memory per accelerator.")] = 0.0
    host_memory_gib: Annotated[Gib, msgspec.Meta(description="Host memory per replica.")] = 0.0
    accelerator_models: Annotated[
        tuple[Annotated[str, msgspec.Meta(min_length=1)], ...],
        msgspec.Meta(max_length=64, description="Accepted accelerator models; empty: any."),
    ] = ()
    mig_profile: MigProfile | None = None
    latency_slo_ms: Annotated[float, msgspec.Meta(gt=0, le=3_600_000)] | None = None
    traffic_by_region: Annotated[
        dict[Annotated[str, msgspec.Meta(min_length=1, max_length=128)], Weight],
        msgspec.Meta(max_length=256, description="Share of requests per network region."),
    ] = {}
    requests_per_s: Annotated[
        float, msgspec.Meta(ge=0, le=1e9, description="Expected peak over all replicas.")
    ] = 0.0
    reference_ms_per_request: (
        Annotated[float, msgspec.Meta(gt=0, le=3_600_000, description="Compute time on one A100.")]
        | None
    ) = None
    max_replicas_per_node: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 1
    preemptible: bool = True
    sites: Sites = ("edge",)
    node_selector: NodeSelector = {}
    affinity: Affinity = ()
    tolerations: Tolerations = ()
    group: Group = None
    anti_affinity_groups: AntiAffinityGroups = ()
    score_weights: ScoreWeights = {}
    batching: BatchingSpec | None = None
    autoscale: AutoscaleSpec | None = None
    canary: CanarySpec | None = None  # set by a model update with a rollout
    depends_on: DependsOn = ()
    allow_unschedulable: AllowUnschedulable = False

    def __post_init__(self) -> None:
        scale = self.autoscale
        if self.replicas == _REPLICAS_UNSET:
            # Not given: an autoscaled deployment starts at its floor (a default of 1
            # would refuse every autoscale whose min_replicas is above 1).
            msgspec.structs.force_setattr(
                self, "replicas", scale.min_replicas if scale is not None else 1
            )
        if scale is not None and not scale.min_replicas <= self.replicas <= scale.max_replicas:
            raise FieldError(
                "replicas",
                f"must be within autoscale's {scale.min_replicas}..{scale.max_replicas}",
            )
        if self.min_replicas is not None and not 1 <= self.min_replicas <= self.replicas:
            raise FieldError("min_replicas", f"must be within 1..replicas ({self.replicas})")
        floor = self.min_available
        if floor is not None and floor > self.replicas:
            raise FieldError("min_available", f"must be within 0..replicas ({self.replicas})")
        if floor is not None and scale is not None and floor > scale.min_replicas:
            # The autoscaler may scale down to min_replicas: a higher floor could not hold.
            raise FieldError(
                "min_available",
                f"must be within 0..autoscale's min_replicas ({scale.min_replicas})",
            )
        if len(set(self.accepted_kinds)) != len(self.accepted_kinds):
            raise FieldError("accepted_kinds", "names a kind twice")
        if len(set(self.sites)) != len(self.sites):
            raise FieldError("sites", "names a site twice")
        _check_dependencies(self.depends_on)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def host_memory_bytes(self) -> int:
        return int(self.host_memory_gib * GIB)


WorkSpec = TrainingJobSpec | DeploymentSpec
SPEC_TYPES: Final[dict[SpecKind, type[TrainingJobSpec] | type[DeploymentSpec]]] = {
    "training": TrainingJobSpec,
    "deployment": DeploymentSpec,
}

TRAINING_DECODER: Final = msgspec.json.Decoder(TrainingJobSpec)
DEPLOYMENT_DECODER: Final = msgspec.json.Decoder(DeploymentSpec)
_ENCODER: Final = msgspec.json.Encoder()


def encode_spec(spec: WorkSpec) -> bytes:
    """The canonical JSON of a spec (every field, defaults filled in, in declaration order):
    what the store keeps, so equal specs have equal bytes whatever their original layout."""
    return _ENCODER.encode(spec)


def decode_spec(kind: SpecKind, document: bytes) -> WorkSpec:
    decoder = TRAINING_DECODER if kind == "training" else DEPLOYMENT_DECODER
    return decoder.decode(document)


# ---- error paths -----------------------------------------------------------------------


def describe_error(error: msgspec.ValidationError) -> tuple[str, str]:
    """(path of the field at fault, e.g. ``$.workers``; the reason) of a validation error:
    what `invalid_params` and the CLI show."""
    refused = FieldError.from_msgspec(error)
    return json_path(refused.path), refused.reason
