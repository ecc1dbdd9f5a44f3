"""The MQTT v1 wire contract: one frozen msgspec Struct per topic payload.

Third parties build on these types (docs/mqtt.md), so they evolve only by adding
fields with defaults. Nothing is renamed or removed inside v1. Decoders ignore
unknown fields on purpose: an older consumer must keep working when a newer
agent adds a field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Final, Literal

import msgspec

from shared.agent_packages import AGENT_VERSION_PATTERN, MAX_PACKAGE_BYTES
from shared.enrolment_certificate import MAX_CERTIFICATE_CHARS
from shared.errors import worded_pattern
from shared.taints import MAX_TAINT_KEY_CHARS, MAX_TAINT_VALUE_CHARS, MAX_TAINTS, TaintEffect

# Bumped in its minor part whenever a defaulted field is added to any v1 payload;
# the major part always equals the topic version.
SCHEMA_VERSION = "1.13"
# The most a cgroup's pids.max takes (PID_MAX_LIMIT on 64-bit kernels): no more
# processes can exist at once, so no pids limit is larger.
KERNEL_PIDS_MAX: Final = 4_194_304

# Each pattern is worded (shared/errors.py): a refusal says what it takes, not the regex.
# A name's (cloud/work/specs.py words the same pattern the same way: a pattern has one
# wording, and other words for it are refused at import).
# "(?!\n)": Python's $ also matches before a final newline; ECMA's never does.
NAME_PATTERN: Final = worded_pattern(
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$(?!\n)",
    "must be letters, digits, '.', '_' and '-', starting with a letter or digit; at most "
    "128 characters",
)
# Node ids become MQTT topic levels, so the MQTT wildcards and separators are banned.
NodeId = Annotated[
    str,
    msgspec.Meta(
        pattern=NAME_PATTERN,
        description="Unique node id; a single MQTT topic level (no '/', '+', '#').",
    ),
]
Percent = Annotated[float, msgspec.Meta(ge=0, le=100)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
Timestamp = Annotated[float, msgspec.Meta(ge=0, description="Seconds since the Unix epoch, UTC.")]

SchemaVersion = Annotated[
    str,
    msgspec.Meta(
        pattern=worded_pattern(r"^1\.[0-9]+$(?!\n)", "must be 1.<minor>, e.g. 1.13"),
        description="major.minor; the major part always equals the topic version (1).",
    ),
]

# NVML's form (`nvmlPciInfo_t.busId`), or empty; shared with discovery, which leaves out
# what does not fit rather than have the birth refused.
PCI_BUS_ID_PATTERN = worded_pattern(
    r"^([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])?$(?!\n)",
    "must be a PCI address as NVML writes it, domain:bus:device.function "
    "(00000000:3B:00.0), or empty",
)
# A version field (here, and the rollouts an admin asks for: cloud/upgrades/views.py).
AGENT_VERSION_FIELD_PATTERN: Final = worded_pattern(
    f"^{AGENT_VERSION_PATTERN}$(?!\\n)",
    "must be a version: letters, digits, '.', '+', '!', '_' and '-', starting with a digit; "
    "at most 64 characters, e.g. 1.4.0",
)

Site = Literal["cloud", "edge"]
AcceleratorKind = Literal["gpu", "npu", "cpu"]
# How a node contains the training workers it runs (docs/isolation.md), weakest first:
# `none` runs them as the agent's user (the operator said so); `user` as an unprivileged
# user of their own, held by cgroups; `sandbox` also in namespaces of their own
# (bubblewrap: private /tmp, the agent's files and other processes out of sight).
# `unavailable`: the node cannot isolate work and was not told to run it without.
IsolationLevel = Literal["none", "user", "sandbox", "unavailable"]
ResourceLimit = Literal["memory", "cpu", "pids", "devices"]
ImagePullPolicy = Literal["if-not-present", "always", "never"]
# per-worker: one process per gang worker on the node (RANK, LOCAL_RANK each);
# per-node: one process per node that starts its workers itself (torchrun, accelerate).
LaunchMode = Literal["per-worker", "per-node"]
NodeState = Literal["online", "offline"]
OfflineReason = Literal["connection-lost", "shutdown", "telemetry-stale"]


class WireStruct(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=False):
    """Base of every payload: immutable, keyword-only, all fields always encoded."""


class Accelerator(WireStruct, frozen=True, kw_only=True):
    """One schedulable device of a node: a GPU (or MIG instance), an NPU, or the host CPU."""

    id: Annotated[str, msgspec.Meta(description="Stable within the node, e.g. gpu0, gpu0-mig1.")]
    kind: AcceleratorKind
    vendor: str
    model: str
    memory_bytes: NonNegativeInt
    compute_units: Annotated[
        int, msgspec.Meta(ge=0, description="GPU: SMs; CPU: logical cores; NPU: engines/tiles.")
    ]
    idle_power_w: NonNegativeFloat | None = None
    max_power_w: NonNegativeFloat | None = None
    relative_speed: (
        Annotated[
            float,
            msgspec.Meta(gt=0, description="Throughput relative to one NVIDIA A100 (1.0)."),
        ]
        | None
    ) = None
    onnx_providers: Annotated[
        tuple[str, ...],
        msgspec.Meta(
            description="ONNX Runtime execution providers usable on this device, best first."
        ),
    ] = ()
    uuid: str | None = None
    index: (
        Annotated[int, msgspec.Meta(ge=0, description="Device index, e.g. CUDA_VISIBLE_DEVICES.")]
        | None
    ) = None
    parent_id: Annotated[
        str | None, msgspec.Meta(description="For a MIG instance: the id of its physical GPU.")
    ] = None
    features: Annotated[
        tuple[str, ...], msgspec.Meta(description="Capability flags, e.g. CPU ISA extensions.")
    ] = ()
    healthy: Annotated[
        bool,
        msgspec.Meta(
            description="False while the device fails (1.5): nothing is placed on it and "
            "what ran there is moved."
        ),
    ] = True
    health: Annotated[str, msgspec.Meta(description="Why it is unhealthy (1.5).")] = ""
    pci_bus_id: Annotated[
        str,
        msgspec.Meta(
            pattern=PCI_BUS_ID_PATTERN,
            description="PCI address as NVML writes it, domain:bus:device.function "
            "(00000000:3B:00.0); a MIG instance's is its physical GPU's. Empty where "
            "unknown or not on PCI (1.11).",
        ),
    ] = ""


def common_providers(devices: Sequence[Accelerator]) -> tuple[str, ...]:
    """The ONNX Runtime providers every one of `devices` offers, in the first's order of
    preference (what work spread over them can count on)."""
    if not devices:
        return ()
    rest = [set(device.onnx_providers) for device in devices[1:]]
    return tuple(p for p in devices[0].onnx_providers if all(p in offered for offered in rest))


class HostInfo(WireStruct, frozen=True, kw_only=True):
    hostname: str
    os: str
    arch: str
    cpu_logical_cores: NonNegativeInt
    memory_total_bytes: NonNegativeInt


class NodeTaint(WireStruct, frozen=True, kw_only=True):
    """A taint the node declares (1.4): only work that tolerates it is placed there
    (`NoSchedule`), or other work avoids it (`PreferNoSchedule`)."""

    key: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TAINT_KEY_CHARS)]
    value: Annotated[str, msgspec.Meta(max_length=MAX_TAINT_VALUE_CHARS)] = ""
    effect: TaintEffect = "NoSchedule"


AgentUpgradeOutcome = Literal["failed", "rolled-back"]


class AgentUpgradeReport(WireStruct, frozen=True, kw_only=True):
    """What became of the last agent upgrade that did not take (1.11): the package could
    not be fetched, verified or installed (`failed`), or the new version did not announce
    itself in time and the agent went back to the version it ran (`rolled-back`)."""

    version: Annotated[str, msgspec.Meta(max_length=64)]
    rollout_id: Annotated[str, msgspec.Meta(max_length=64)] = ""
    outcome: AgentUpgradeOutcome
    detail: Annotated[str, msgspec.Meta(max_length=1024)] = ""
    at: Annotated[float, msgspec.Meta(ge=0, description="UTC epoch seconds.")]


class NodeStatus(WireStruct, frozen=True, kw_only=True):
    """`status` (retained, QoS 1): the birth message, and the will when the node drops."""

    schema_version: SchemaVersion = SCHEMA_VERSION
    node_id: NodeId
    state: NodeState
    offline_reason: OfflineReason | None = None
    instance_id: Annotated[str, msgspec.Meta(description="New on every agent start.")]
    agent_version: str
    site: Site
    zone: Annotated[str, msgspec.Meta(description="Grid zone, e.g. CA-ON, DE, US-CAL-CISO.")]
    region: Annotated[str, msgspec.Meta(description="Network region, e.g. europe-west3.")]
    labels: dict[str, str] = {}
    host: HostInfo
    accelerators: tuple[Accelerator, ...]
    telemetry_interval_s: Annotated[float, msgspec.Meta(gt=0)]
    started_at: Timestamp
    sent_at: Annotated[
        float, msgspec.Meta(ge=0, description="UTC epoch seconds; a will carries its connect time.")
    ]
    runs_training: Annotated[
        bool | None,
        msgspec.Meta(
            description=(
                "Whether this agent runs training jobs (1.3); absent from older agents, "
                "which run training exactly when their site is cloud."
            )
        ),
    ] = None
    taints: Annotated[
        tuple[NodeTaint, ...],
        msgspec.Meta(max_length=MAX_TAINTS, description="Taints from the agent's settings (1.4)."),
    ] = ()
    isolation: Annotated[
        IsolationLevel | None,
        msgspec.Meta(
            description=(
                "How the node contains the training workers it runs (1.8): none, user, "
                "sandbox, or unavailable (it refuses training); null: it runs no "
                "training, or an older agent (runs workers as its own user)."
            )
        ),
    ] = None
    isolation_note: Annotated[
        str,
        msgspec.Meta(
            max_length=1024, description="Why the isolation is no stronger, for people (1.8)."
        ),
    ] = ""
    resource_limits: Annotated[
        tuple[ResourceLimit, ...],
        msgspec.Meta(
            max_length=8,
            description="What the node holds each worker to with cgroups (1.8).",
        ),
    ] = ()
    container_runtimes: Annotated[
        tuple[Annotated[str, msgspec.Meta(max_length=64)], ...],
        msgspec.Meta(
            max_length=8,
            description="Container runtimes that run work with an image here, e.g. podman (1.8).",
        ),
    ] = ()
    sealing_public_key: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=64,
                description=(
                    "Base64 of the node's X25519 public key (1.8): secrets for its workers "
                    "are sealed to it (HPKE, shared/sealing.py)."
                ),
            ),
        ]
        | None
    ) = None
    enrolment_certificate: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=MAX_CERTIFICATE_CHARS,
                description=(
                    "What the control plane certified this node enrolled as (1.10, "
                    "shared/enrolment_certificate.py): shown so that a control plane that "
                    "lost its store can re-admit the node."
                ),
            ),
        ]
        | None
    ) = None
    identity_proof: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=64,
                description=(
                    "HMAC proving this agent instance holds the sealing key its certificate "
                    "names (1.10, shared/enrolment_certificate.py)."
                ),
            ),
        ]
        | None
    ) = None
    self_upgrade: Annotated[
        bool,
        msgspec.Meta(
            description="Whether this agent can upgrade itself (1.11): it runs under the "
            "upgrade supervisor (edge/upgrade/)."
        ),
    ] = False
    agent_upgrade: Annotated[
        AgentUpgradeReport | None,
        msgspec.Meta(description="The last agent upgrade that did not take (1.11)."),
    ] = None


class AcceleratorSample(WireStruct, frozen=True, kw_only=True):
    id: str
    utilization_pct: Percent
    memory_used_bytes: NonNegativeInt
    power_w: NonNegativeFloat | None = None
    temperature_c: float | None = None
    energy_j: (
        Annotated[
            float, msgspec.Meta(ge=0, description="Cumulative energy since the agent started, J.")
        ]
        | None
    ) = None


# Upper bounds no node's real serving figures come near (a billion requests a second, a
# day's latency, a million requests a batch): the autoscaler and the rollout gates
# multiply and divide by them, so telemetry with a sample beyond them (1e308
# requests/s) is refused as it comes in rather than overflowing there.
RequestsPerSecond = Annotated[float, msgspec.Meta(ge=0, le=1e9)]
LatencyMs = Annotated[float, msgspec.Meta(ge=0, le=86_400_000)]
MeanBatchSize = Annotated[float, msgspec.Meta(ge=0, le=1_000_000)]
RejectedCount = Annotated[int, msgspec.Meta(ge=0, description="Refused with 429 (queue full).")]


class ReplicaSample(WireStruct, frozen=True, kw_only=True):
    """One replica's part of its deployment's serving figures on this node (1.13): a
    canary rollout judges a canary replica apart from a replica of the current model
    beside it."""

    replica: Annotated[int, msgspec.Meta(ge=0, description="Replica number.")]
    requests: NonNegativeInt
    errors: NonNegativeInt
    rejected: RejectedCount
    requests_per_s: RequestsPerSecond
    latency_p50_ms: LatencyMs | None = None
    latency_p95_ms: LatencyMs | None = None
    latency_p99_ms: LatencyMs | None = None
    mean_batch_size: MeanBatchSize | None = None


class DeploymentSample(WireStruct, frozen=True, kw_only=True):
    """Serving figures of one deployment on this node since the previous sample (1.2):
    all its replicas here together, each request counted once."""

    deployment_id: str
    requests: NonNegativeInt
    errors: NonNegativeInt
    rejected: RejectedCount
    requests_per_s: RequestsPerSecond
    latency_p50_ms: LatencyMs | None = None
    latency_p95_ms: LatencyMs | None = None
    latency_p99_ms: LatencyMs | None = None
    mean_batch_size: MeanBatchSize | None = None
    replicas: Annotated[
        tuple[ReplicaSample, ...],
        msgspec.Meta(
            description="The same figures per replica on this node (1.13); empty: not "
            "sampled per replica (an older agent)."
        ),
    ] = ()


class Telemetry(WireStruct, frozen=True, kw_only=True):
    """`telemetry` (QoS 0, not retained): one periodic sample of a node."""

    schema_version: SchemaVersion = SCHEMA_VERSION
    node_id: NodeId
    instance_id: str
    # At most 2**53 (a sample a millisecond for 285,000 years): the control plane keeps
    # how far each node's samples were counted (cloud/store/usage.py), and a number
    # past what its column holds would fail every node's usage flush, not this node's.
    seq: Annotated[int, msgspec.Meta(ge=0, le=2**53, description="Increments by one per sample.")]
    sampled_at: Timestamp
    interval_s: Annotated[float, msgspec.Meta(gt=0)]
    cpu_utilization_pct: Percent
    memory_used_bytes: NonNegativeInt
    memory_total_bytes: NonNegativeInt
    accelerators: tuple[AcceleratorSample, ...] = ()
    deployments: tuple[DeploymentSample, ...] = ()


class DesiredDeployment(WireStruct, frozen=True, kw_only=True):
    """One replica of an inference deployment assigned to this node (schema 1.2 adds
    all but deployment_id)."""

    deployment_id: str
    replica: Annotated[int, msgspec.Meta(ge=0, description="Replica number.")] = 0
    model_id: Annotated[
        str | None, msgspec.Meta(description="Model registry id of the ONNX model to serve.")
    ] = None
    model_url: Annotated[
        str | None, msgspec.Meta(description="Where to download the model (a signed URL).")
    ] = None
    model_sha256: Annotated[
        str | None, msgspec.Meta(description="Hex sha256 the downloaded file must have.")
    ] = None
    model_size_bytes: NonNegativeInt | None = None
    accelerator_kind: AcceleratorKind = "cpu"
    accelerators: Annotated[
        int, msgspec.Meta(ge=1, description="How many: for a CPU, cores (threads to use).")
    ] = 1
    accelerator_ids: Annotated[
        tuple[str, ...],
        msgspec.Meta(description="Accelerators of this node assigned to it (none for CPU cores)."),
    ] = ()
    providers: Annotated[
        tuple[str, ...],
        msgspec.Meta(
            description="ONNX Runtime execution providers accepted, best first; empty: any."
        ),
    ] = ()
    max_batch_size: Annotated[
        int, msgspec.Meta(ge=1, description="Dynamic batching: requests per model run, at most.")
    ] = 1
    max_queue_delay_ms: Annotated[
        float,
        msgspec.Meta(ge=0, description="Dynamic batching: how long a request may wait for more."),
    ] = 0.0


class DesiredTraining(WireStruct, frozen=True, kw_only=True):
    """One worker of a training job assigned to this node (schema 1.1 adds all but job_id)."""

    job_id: str
    attempt: Annotated[
        int, msgspec.Meta(ge=0, description="Placement attempt; a new attempt is a fresh run.")
    ] = 0
    command: Annotated[tuple[str, ...], msgspec.Meta(description="argv; run without a shell.")] = ()
    env: dict[str, str] = {}
    working_dir: str | None = None
    accelerator_ids: Annotated[
        tuple[str, ...], msgspec.Meta(description="Accelerators of this node assigned to the job.")
    ] = ()
    rank: Annotated[
        int,
        msgspec.Meta(ge=0, description="The gang rank of this node's first worker (RANK)."),
    ] = 0
    world_size: Annotated[
        int, msgspec.Meta(ge=1, description="Workers in the gang, on all nodes (WORLD_SIZE).")
    ] = 1
    master_addr: str = ""
    master_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0
    grace_period_s: Annotated[
        float, msgspec.Meta(ge=0, description="SIGTERM to SIGKILL on stop.")
    ] = 30.0
    reference_duration_s: (
        Annotated[
            float,
            msgspec.Meta(
                gt=0, description="Expected run time on one A100; simulated nodes use it."
            ),
        ]
        | None
    ) = None
    power_limit_w: (
        Annotated[
            float,
            msgspec.Meta(
                gt=0,
                le=100_000,
                description=(
                    "Carbon-aware power capping (1.6): hold each assigned GPU to this "
                    "power limit for the run, clamped to the device's allowed range, and "
                    "restore the device's default when the run ends. Null: the default."
                ),
            ),
        ]
        | None
    ) = None
    cpu_cores: (
        Annotated[
            int,
            msgspec.Meta(
                ge=1,
                le=1_000_000,
                description=(
                    "CPU cores the scheduler holds for this worker on the node (1.7): a "
                    "GPU/NPU job's cpus_per_worker, a CPU job's cores, summed over its "
                    "members here. Exported as GREENFED_CPU_CORES and, unless the job's "
                    "env sets it, OMP_NUM_THREADS. Null: none held."
                ),
            ),
        ]
        | None
    ) = None
    tenant: Annotated[
        str,
        msgspec.Meta(
            max_length=128,
            description="The tenant whose work it is (1.8): whose user it runs as.",
        ),
    ] = ""
    processes: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=1024,
            description=(
                "Workers of the gang on this node (1.8), ranks rank..rank+processes-1: "
                "one process each (launch per-worker), or one process told them "
                "(per-node: LOCAL_WORLD_SIZE, NPROC_PER_NODE)."
            ),
        ),
    ] = 1
    node_rank: Annotated[
        int, msgspec.Meta(ge=0, description="This node's place among the gang's nodes (1.8).")
    ] = 0
    nodes: Annotated[int, msgspec.Meta(ge=1, description="Nodes the gang runs on (1.8).")] = 1
    launch: LaunchMode = "per-worker"
    host_memory_bytes: (
        Annotated[
            int,
            msgspec.Meta(
                ge=1, description="Host memory each worker is held to (1.8); null: not limited."
            ),
        ]
        | None
    ) = None
    pids_limit: (
        Annotated[
            int,
            msgspec.Meta(
                ge=1,
                le=KERNEL_PIDS_MAX,
                description="Processes and threads each worker may have (1.8); null: the node's.",
            ),
        ]
        | None
    ) = None
    min_isolation: Annotated[
        IsolationLevel,
        msgspec.Meta(
            description="The least isolation the job accepts (1.8); a weaker node refuses it."
        ),
    ] = "none"
    image: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=512,
                description="OCI image to run the command in (1.8); null: on the node itself.",
            ),
        ]
        | None
    ) = None
    image_pull_policy: ImagePullPolicy = "if-not-present"
    secret_names: Annotated[
        tuple[str, ...],
        msgspec.Meta(
            max_length=256,
            description=(
                "Names of the secret variables `sealed_secrets` holds (1.8); the worker does "
                "not start without them."
            ),
        ),
    ] = ()
    sealed_secrets: Annotated[
        str | None,
        msgspec.Meta(
            description=(
                "The job's secret_env and registry credentials sealed to this node's key "
                "for this job and attempt (1.8, shared/sealing.py); never plaintext."
            )
        ),
    ] = None
    has_secrets: Annotated[
        bool,
        msgspec.Meta(
            description=(
                "The job has secrets (secret_env or a registry password; 1.12): without "
                "`sealed_secrets` the worker does not start. Absent (an older control "
                "plane): only `secret_names` says so."
            )
        ),
    ] = False


class AgentUpgrade(WireStruct, frozen=True, kw_only=True):
    """The agent version a node is asked to run (1.11, `greenfed nodes upgrade`): a
    package the control plane serves and signed (shared/agent_packages.py)."""

    version: Annotated[str, msgspec.Meta(pattern=AGENT_VERSION_FIELD_PATTERN)]
    rollout_id: Annotated[
        str,
        msgspec.Meta(
            max_length=64,
            description="The rollout asking: a version that did not take is tried again "
            "only by another rollout.",
        ),
    ]
    url: Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]
    sha256: Annotated[
        str,
        msgspec.Meta(
            pattern=worded_pattern(
                r"^[0-9a-f]{64}$(?!\n)", "must be a sha256: 64 lower-case hex digits"
            )
        ),
    ]
    size_bytes: Annotated[int, msgspec.Meta(ge=1, le=MAX_PACKAGE_BYTES)]
    signature: Annotated[
        str,
        msgspec.Meta(
            max_length=128,
            description="Base64 Ed25519 signature of the package statement (agent_packages.py).",
        ),
    ]
    health_timeout_s: Annotated[
        float,
        msgspec.Meta(
            ge=5,
            le=3600,
            description="How long the new version has to announce itself before the agent "
            "goes back to the version it ran.",
        ),
    ] = 120.0


class DesiredState(WireStruct, frozen=True, kw_only=True):
    """`desired` (retained, QoS 1, cloud to agent): everything the node should run."""

    schema_version: SchemaVersion = SCHEMA_VERSION
    node_id: NodeId
    generation: NonNegativeInt
    deployments: tuple[DesiredDeployment, ...] = ()
    training: tuple[DesiredTraining, ...] = ()
    issued_at: Timestamp
    cluster_id: Annotated[
        str | None,
        msgspec.Meta(
            description="The control plane's store (1.3): generations count within one cluster."
        ),
    ] = None
    for_instance: Annotated[
        Annotated[str, msgspec.Meta(max_length=256)] | None,
        msgspec.Meta(
            description=(
                "The agent instance the document was issued for (1.9): the node's current "
                "birth as the control plane saw it when it signed; empty: it knew none. An "
                "agent that has applied nothing from the broker since it started (nothing, or "
                "only the document kept on its disk) applies only a document issued for "
                "itself. Null: a control plane older than 1.9."
            ),
        ),
    ] = None
    agent_upgrade: Annotated[
        AgentUpgrade | None,
        msgspec.Meta(description="The agent version to run (1.11); null: keep the running one."),
    ] = None
    # `signature` stays the LAST field: the signing rule (shared/desired_signature.py)
    # splices it at the end of the encoded document. New fields go before it.
    signature: Annotated[
        str | None,
        msgspec.Meta(
            description="Base64 Ed25519 signature of the document with signature null (1.3)."
        ),
    ] = None


TrainingRunState = Literal["starting", "running", "succeeded", "failed", "stopped"]
# A worker in these states holds its devices (and any power limit asked for them).
TRAINING_RUN_LIVE_STATES: tuple[TrainingRunState, ...] = ("starting", "running")


class ReportedTraining(WireStruct, frozen=True, kw_only=True):
    """What became of one desired training worker (schema 1.1)."""

    job_id: str
    attempt: NonNegativeInt = 0
    state: TrainingRunState
    exit_code: int | None = None
    reason: Annotated[str, msgspec.Meta(description="Why it failed or stopped, for people.")] = ""
    started_at: Timestamp | None = None
    finished_at: Timestamp | None = None
    power_limit_w: Annotated[
        float | None,
        msgspec.Meta(
            description=(
                "The power limit the agent holds the worker's GPUs to (1.6): the asked "
                "one clamped to the devices' range; null: the devices' default."
            )
        ),
    ] = None
    power_limit_note: Annotated[
        str,
        msgspec.Meta(description="Why an asked power limit is not applied (1.6), for people."),
    ] = ""


ReplicaState = Literal["starting", "ready", "failed"]


class ReportedDeployment(WireStruct, frozen=True, kw_only=True):
    """What became of one desired inference replica (schema 1.2)."""

    deployment_id: str
    replica: NonNegativeInt = 0
    state: ReplicaState
    provider: Annotated[
        str | None, msgspec.Meta(description="The execution provider it runs on.")
    ] = None
    reason: Annotated[
        str, msgspec.Meta(description="Why it failed, or a provider fallback, for people.")
    ] = ""
    endpoint: Annotated[
        str | None, msgspec.Meta(description="URL of the replica's inference endpoint.")
    ] = None
    model_sha256: Annotated[
        str | None, msgspec.Meta(description="The model it serves (sha256 of the file).")
    ] = None


class ReportedState(WireStruct, frozen=True, kw_only=True):
    """`reported` (retained, QoS 1): what the agent has applied."""

    schema_version: SchemaVersion = SCHEMA_VERSION
    node_id: NodeId
    instance_id: str
    observed_generation: NonNegativeInt
    reported_at: Timestamp
    training: tuple[ReportedTraining, ...] = ()
    deployments: tuple[ReportedDeployment, ...] = ()
    cluster_id: Annotated[
        str | None,
        msgspec.Meta(description="The cluster whose generation observed_generation counts (1.3)."),
    ] = None


EventKind = Literal[
    "agent-started",
    "agent-stopping",
    "probe-failed",
    "desired-rejected",
    "started",
    "ready",
    "failed",
    "exited",
    "preempted",
]


class NodeEvent(WireStruct, frozen=True, kw_only=True):
    """`events` (QoS 1, not retained): a lifecycle event, deduplicated by event_id."""

    schema_version: SchemaVersion = SCHEMA_VERSION
    node_id: NodeId
    event_id: Annotated[str, msgspec.Meta(description="Idempotency key, unique per event.")]
    kind: EventKind
    subject: Annotated[
        str | None, msgspec.Meta(description="Job, deployment or probe the event is about.")
    ] = None
    detail: str = ""
    occurred_at: Timestamp


class JobLogChunk(WireStruct, frozen=True, kw_only=True):
    """`logs` (QoS 1, not retained; schema 1.1): new output of one training worker."""

    schema_version: SchemaVersion = SCHEMA_VERSION
    node_id: NodeId
    job_id: str
    attempt: NonNegativeInt = 0
    offset: Annotated[
        int, msgspec.Meta(ge=0, description="Byte offset of `text` in the worker's output.")
    ]
    text: Annotated[str, msgspec.Meta(description="UTF-8; undecodable bytes replaced.")]
    dropped_bytes: Annotated[
        int, msgspec.Meta(ge=0, description="Output before this chunk that was not shipped.")
    ] = 0
    sent_at: Timestamp


# One reused encoder for all payloads, one decoder per payload type (msgspec's
# recommended pattern: building them per message costs more than decoding).
ENCODER = msgspec.json.Encoder()
STATUS_DECODER = msgspec.json.Decoder(NodeStatus)
TELEMETRY_DECODER = msgspec.json.Decoder(Telemetry)
DESIRED_DECODER = msgspec.json.Decoder(DesiredState)
REPORTED_DECODER = msgspec.json.Decoder(ReportedState)
EVENT_DECODER = msgspec.json.Decoder(NodeEvent)
LOG_DECODER = msgspec.json.Decoder(JobLogChunk)


def encode(message: WireStruct) -> bytes:
    return ENCODER.encode(message)
