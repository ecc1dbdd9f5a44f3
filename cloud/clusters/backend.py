"""The cluster back-end interface: capacity greenfed does not run node by node.

A back-end is a cluster with a scheduler of its own (Slurm, a Kubernetes cluster with
Kueue or Volcano) that greenfed places work on. It answers four questions and takes
three orders, all in the terms below; cloud/clusters/bridge.py turns those into what
the rest of the control plane already understands (nodes in the registry, `reported`
states, the scheduling loop's documents), so filters, scores, quotas, gangs, green
terms and explanations apply to a cluster's capacity as to any other
(docs/backends.md).

| question / order | method |
|---|---|
| what capacity is there, free now, and how busy is the cluster's own queue | `capacity` |
| what became of greenfed's jobs there (state, reason, exit code, times) | `jobs` |
| run this gang | `submit` (idempotent: a gang already there is adopted, never run twice) |
| stop that job | `cancel` |
| what did it print | `read_output` |

A back-end raises `ClusterUnreachable` when it cannot reach the cluster: the bridge
then keeps what it last knew, places nothing new there and resubmits nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

# greenfed's view of a back-end job (TrainingRunState, shared/messages.py, plus
# `pending`: accepted by the cluster, waiting in its own queue).
ClusterJobState = Literal["pending", "running", "succeeded", "failed", "stopped"]

# Why a job waits in the cluster's own queue, as greenfed acts on it: `turn`, it waits
# its turn (resources, priority, a dependency, a begin time, a limit: the cluster starts
# it in time, never given up for it); `cannot_start`, it cannot start where it is (its
# machines or its partition take no work, or the partition does not allow its shape:
# it would wait there for ever, and the bridge gives it up after a grace).
QueueWait = Literal["turn", "cannot_start"]

# Whether one of a machine's partitions takes work: `up`; `drain` (it takes no new job),
# `down` and `inactive` (nothing in it starts); `unknown`: a state the back-end cannot
# read, taken as not up.
PartitionAvailability = Literal["up", "drain", "down", "inactive", "unknown"]

# The most accelerators of one type a machine is believed to have (the largest have 8
# or 16): each becomes an entry of the node's birth, so a count past this is a broken
# record, its accelerators left out, not hundreds of thousands built every refresh.
MAX_ACCELERATORS_PER_NODE: Final = 256


def partitions_not_up(down: Mapping[str, PartitionAvailability]) -> str:
    """Why a machine takes no work through those partitions, for people
    (`partition gpu down, old inactive`)."""
    return "partition " + ", ".join(f"{name} {state}" for name, state in down.items())


class ClusterUnreachable(RuntimeError):
    """The cluster's controller did not answer (down, network, credentials)."""


class ClusterRefused(RuntimeError):
    """The cluster answered and refused an order (a bad partition, a limit)."""


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """One machine of the cluster as its scheduler sees it."""

    name: str
    partitions: tuple[str, ...]
    cpus: int
    memory_bytes: int
    # Accelerators by the cluster's own type name (a GRES type, a device plugin's
    # resource): how many the node has, and how many the cluster has allocated.
    accelerators: Mapping[str, int] = field(default_factory=dict)
    allocated: Mapping[str, int] = field(default_factory=dict)
    # Why no new work should land there (drained, down, none of its partitions up), for
    # people; "": schedulable.
    unavailable: str = ""
    # Each of its partitions' availability, as the cluster last said; one not named
    # (not read, created since) takes work. The bridge judges a machine by the partitions
    # greenfed may use there, not by all of them.
    partition_availability: Mapping[str, PartitionAvailability] = field(default_factory=dict)

    def takes_work_in(self, partition: str) -> bool:
        """Whether a job submitted through that partition may start on the machine (as
        far as the partition goes: `unavailable` says the rest)."""
        return self.partition_availability.get(partition, "up") == "up"


@dataclass(frozen=True, slots=True)
class ClusterCapacity:
    nodes: tuple[ClusterNode, ...]
    # Jobs waiting in the cluster's own queue (anyone's): a pressure signal.
    pending_jobs: int = 0


@dataclass(frozen=True, slots=True)
class GangMember:
    """The workers of a gang on one node."""

    node: str  # the cluster's node name
    processes: int  # workers (tasks) on it
    accelerators: int  # accelerators of `accelerator_type` it holds
    cpus: int  # CPU cores it holds (0: the cluster's default)
    # Host memory its workers hold together, as greenfed's scheduler counted it there
    # (0: none asked, the cluster's default).
    host_memory_bytes: int = 0


@dataclass(frozen=True, slots=True)
class GangRequest:
    """One attempt of one greenfed job: what `submit` runs, all members at once."""

    job_id: str
    attempt: int
    tenant: str
    partition: str
    members: tuple[GangMember, ...]
    accelerator_type: str | None  # the cluster's type name; None: CPU only
    command: tuple[str, ...]
    env: Mapping[str, str]
    working_dir: str | None
    master_port: int
    # Per-node launch: one process per node that starts its workers itself.
    per_node: bool
    time_limit_s: float | None
    priority: str  # p0, p1, p2
    grace_period_s: float
    # The job's secrets, opened (only for a cluster registered to accept them).
    secret_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """The name a back-end gives the job, by which it is adopted after a restart."""
        return job_key(self.job_id, self.attempt)


def job_key(job_id: str, attempt: int) -> str:
    """The name a back-end gives an attempt of a job (`GangRequest.key`)."""
    return f"gf-{job_id}-{attempt}"


@dataclass(frozen=True, slots=True)
class ClusterJob:
    """A greenfed job as the cluster reports it."""

    backend_id: str  # the cluster's own job id
    job_id: str
    attempt: int
    state: ClusterJobState
    reason: str = ""  # the cluster's reason (a pending reason, why it failed), for people
    # A pending job's: whether it waits its turn or cannot start where it is (None: not
    # pending, or the back-end cannot tell: taken as waiting its turn).
    queue_wait: QueueWait | None = None
    exit_code: int | None = None
    nodes: tuple[str, ...] = ()
    submitted_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    output_path: str | None = None
    # What the cluster measured the job used so far, J (Slurm's ConsumedEnergy, where it
    # gathers energy); None: not measured.
    consumed_energy_j: float | None = None


class ClusterBackend(ABC):
    """One registered cluster. Every method may raise `ClusterUnreachable`."""

    @abstractmethod
    async def capacity(self) -> ClusterCapacity: ...

    @abstractmethod
    async def jobs(self, *, include_ended: bool = True) -> tuple[ClusterJob, ...]:
        """greenfed's jobs there: live ones and those that ended recently, and with
        `include_ended` those the cluster's history holds too (slower: asked for when a
        job is missing, and now and then)."""

    @abstractmethod
    async def submit(self, gang: GangRequest) -> str:
        """Run the gang (once: a job named `gang.key` already there is adopted); its
        back-end id. Raises `ClusterRefused` when the cluster will not take it."""

    @abstractmethod
    async def cancel(self, job: ClusterJob) -> None:
        """Stop the job (idempotent)."""

    @abstractmethod
    async def read_output(self, job: ClusterJob, offset: int, limit: int) -> bytes:
        """Up to `limit` bytes of the job's output from `offset` (b"": nothing more)."""

    @property
    def interface(self) -> str:
        """How the cluster is reached, for people (`slurmrestd v0.0.38`); "" not known yet."""
        return ""

    @property
    def history_error(self) -> str:
        """Why the last `jobs(include_ended=True)` listed the live jobs alone, where a
        back-end can while the cluster's history does not answer (Slurm's accounting is
        slurmdbd, apart from slurmctld); "": the history was read."""
        return ""

    @property
    def pins_machines(self) -> bool | None:
        """Whether a job runs on the machines greenfed chose (False: the cluster picks
        them within the partition; None: not known yet)."""
        return True

    async def close(self) -> None:  # noqa: B027 (optional: most hold nothing)
        """Release what the back-end holds."""
