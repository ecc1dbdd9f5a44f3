"""A registered cluster seen by the control plane as nodes: the cluster's agent, run
inside the control plane.

Each machine of the cluster is a node in the registry (`<cluster>.<machine>`), born
from the back-end's capacity: its GPUs by model (cloud/clusters/gres.py; unknown types
left out and counted), the zone and region of its partition, `runs_training`, labels
naming the cluster, partition and machine. The scheduler places work on those nodes
like on any other: filters, scores, quotas, gangs, the green terms, explanations.
GPUs the cluster has given to other work are shown unhealthy ("in use by the cluster's
other jobs"), so nothing is placed on them; a drained or down machine, one none of
whose partitions greenfed may use is up, and every machine while the cluster does not
answer, carries a `NoSchedule` taint saying why.

The scheduling loop's documents for those nodes come here instead of the broker
(`accept`, from cloud/loop/publisher.py). Each pass of `reconcile`:

- groups the documents' training entries by job and attempt into gangs, one cluster
  job each (cloud/clusters/backend.py `GangRequest`), and submits those the cluster
  does not have (the back-end adopts a job of the same name: nothing runs twice), each
  claimed in the store first: an attempt submitted before, by an earlier run or another
  replica, is never submitted again, even where the cluster has forgotten it;
- cancels greenfed's cluster jobs that no document names any more;
- reports every entry's state in the node's `reported` document, as an agent would
  (pending in the cluster's queue is `starting`, with the cluster's reason), so the
  loop's lifecycle rules (cloud/loop/reports.py) apply unchanged. A job waiting on a
  machine that takes no work (drained, down, none of its usable partitions up: the
  taint above), or whose pending reason says it cannot start where it is (the
  back-end's `queue_wait`: its partition down, its machines not available), for
  `unstartable_grace_s` would wait there for ever: it is reported `stopped`, saying
  why, so the loop places it elsewhere (as a node's loss, never one of the job's own
  retries), and its cluster job is cancelled when its document drops it.

Only the GPUs of greenfed's jobs the cluster runs are sampled busy (what the energy
model bills at full power); those a job waiting in the cluster's queue was placed on
stay claimed in the birth (nothing else is placed on them) but draw nothing of
greenfed's: sampled at 0 W with an energy counter that does not move, so usage metering
bills such a job no GPU energy until the cluster runs it, whatever the gaps between
samples (its share of the machine's modelled host draw aside).

While the cluster does not answer, nothing is submitted or cancelled, the last known
states stand (work keeps running there) and the nodes stay online but tainted: the
loop neither places there nor resubmits anything blindly. While only the cluster's
history does not answer (slurmdbd), the cluster is reached all the same and jobs gone
from its live listing keep their last known states until it does. A job that vanished
from the cluster (deleted behind greenfed's back, or forgotten by a cluster that keeps
no history) ends `failed`, saying so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import structlog
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cloud.clusters.backend import (
    MAX_ACCELERATORS_PER_NODE,
    ClusterBackend,
    ClusterCapacity,
    ClusterJob,
    ClusterNode,
    ClusterRefused,
    ClusterUnreachable,
    GangMember,
    GangRequest,
    partitions_not_up,
)
from cloud.clusters.gres import accelerator_facts
from cloud.fleet.registry import NodeRegistry, Rejection
from shared import __version__
from shared.messages import (
    Accelerator,
    AcceleratorSample,
    DesiredState,
    DesiredTraining,
    HostInfo,
    JobLogChunk,
    NodeStatus,
    NodeTaint,
    ReportedState,
    ReportedTraining,
    Telemetry,
    TrainingRunState,
)
from shared.placement_names import CLUSTER_LABEL
from shared.sealing import SealedSecretsError, public_key_text
from shared.topics import is_valid_node_id
from shared.worker_secrets import open_worker_secrets

DEFAULT_REFRESH_INTERVAL_S: Final = 5.0
# Output read per job and refresh (a job printing faster is followed over several).
MAX_LOG_READ_BYTES: Final = 256 * 1024
MAX_RETRY_INTERVAL_S: Final = 60.0
# While one of greenfed's jobs waits to start there.
FAST_REFRESH_INTERVAL_S: Final = 0.25
FAST_REFRESH_FOR_S: Final = 30.0
HISTORY_INTERVAL_S: Final = 300.0
# How soon a history that could not be read is asked again (a slurmdbd that does not
# answer may take the commands' whole timeout each time).
HISTORY_RETRY_INTERVAL_S: Final = 30.0
# How long after one of greenfed's jobs ended its GPUs still count as its own, not as the
# cluster's other work (Slurm completes a job, epilog included, before freeing them).
LINGER_S: Final = 30.0
# How many refreshes a waiting job's machine must take no work before the job is given
# up there (a state read once may be a moment's: a node registering again after a
# slurmctld restart is `not responding` for a few seconds): a minute at the default.
UNSTARTABLE_GRACE_REFRESHES: Final = 12
UNREACHABLE_TAINT: Final = "greenfed.io/cluster-unreachable"
UNAVAILABLE_TAINT: Final = "greenfed.io/cluster-node-unavailable"
OTHER_WORK: Final = "in use by the cluster's other jobs"
# A time limit from an estimate: twice the estimate at the node's speed, and never
# under ten minutes (estimates are estimates; the cluster kills a job at its limit).
_TIME_LIMIT_FACTOR: Final = 2.0
_MIN_TIME_LIMIT_S: Final = 600.0

_log = structlog.get_logger("greenfed.clusters")


@dataclass(frozen=True, slots=True)
class ClusterPlacement:
    """Where a cluster's machines are, for the green terms: the cluster's zone and
    region, or a partition's own."""

    zone: str
    region: str
    partitions: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def of(self, partition: str) -> tuple[str, str]:
        return self.partitions.get(partition, (self.zone, self.region))


@dataclass(frozen=True, slots=True)
class WorkHints:
    """What a cluster job is submitted with beyond the loop's document: the job's
    priority (the cluster's QOS or nice for it) and its deadline (a time limit)."""

    priority: str = "p1"
    deadline_at: float | None = None  # UTC epoch seconds


@dataclass(slots=True)
class ClusterHealth:
    """What the cluster's listing in `GET /v1/clusters` says of it."""

    reachable: bool = False
    last_contact_at: float | None = None  # UTC epoch seconds
    last_error: str = ""
    pending_jobs: int = 0
    nodes: int = 0
    accelerators: dict[str, int] = field(default_factory=dict)  # by model
    unknown_accelerator_types: dict[str, int] = field(default_factory=dict)
    # Machines whose names cannot be node ids (`<cluster>.<machine>`, one topic level).
    skipped_machines: tuple[str, ...] = ()
    jobs_running: int = 0


def _complete_utf8(data: bytes) -> tuple[str, int]:
    """The text of `data` up to its last whole UTF-8 character, and the bytes used: a
    character split across two reads is decoded whole with the next."""
    for cut in range(min(4, len(data)) + 1):
        try:
            end = len(data) - cut
            return data[:end].decode(), end
        except UnicodeDecodeError:
            continue
    return data.decode(errors="replace"), len(data)


def _live(job: ClusterJob) -> bool:
    return job.state in ("pending", "running")


class ClusterBridge:
    def __init__(
        self,
        name: str,
        backend: ClusterBackend,
        registry: NodeRegistry,
        placement: ClusterPlacement,
        *,
        partitions: tuple[str, ...] = (),
        gres_models: Mapping[str, str] | None = None,
        notify: Callable[[], None] = lambda: None,
        loop_passes: Callable[[], int] | None = None,
        work_hints: Callable[[str], WorkHints | None] | None = None,
        on_log: Callable[[JobLogChunk], None] | None = None,
        telemetry_listeners: Sequence[Callable[[Telemetry], None]] = (),
        sealing_key: X25519PrivateKey | None = None,
        max_time_limit_s: float | None = None,
        claim_submission: Callable[[str, int], Awaitable[bool]] | None = None,
        refresh_interval_s: float = DEFAULT_REFRESH_INTERVAL_S,
        unstartable_grace_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`partitions`: those greenfed may use (empty: every one); `notify`: tells the
        scheduling loop that nodes or reports changed; `loop_passes`: how many passes the
        scheduling loop has made (None: documents are handed over by hand, tests of the
        bridge alone); no cluster job is cancelled for want of a document until a whole
        pass has run since the bridge started (its documents are handed over again
        then: a restarted control plane adopts what runs, never cancels it);
        `claim_submission(job_id, attempt)`: records for good, before the cluster is asked,
        that the attempt is submitted; False where it was already (the store's
        `claim_cluster_submission`; None: this run's memory alone, tests of the bridge);
        `unstartable_grace_s`: how long a job waits in the cluster's queue on a machine
        that takes no work before it is reported `stopped` (None:
        UNSTARTABLE_GRACE_REFRESHES refreshes)."""
        self.name = name
        self.backend = backend
        self._registry = registry
        self._placement = placement
        self._partitions = partitions
        self._gres_models = dict(gres_models or {})
        self._notify = notify
        self._loop_passes = loop_passes
        self._work_hints = work_hints
        self._on_log = on_log
        # Hear every sample the registry took, as ingestion's listeners do (accounting).
        self._telemetry_listeners = telemetry_listeners
        # Set where the cluster accepts secrets: its nodes announce the public half, and
        # each gang's secrets are opened with it just before they are submitted.
        self._sealing_key = sealing_key
        # The longest a job may run there (the registration's; None: as estimates say).
        self._max_time_limit_s = max_time_limit_s
        self._claim_submission = claim_submission
        # Attempts this run claimed: one whose submission did not reach the cluster is
        # submitted again (the back-end adopts it by name where it did after all).
        self._claimed: set[tuple[str, int]] = set()
        self._sealing_public_key = public_key_text(sealing_key) if sealing_key is not None else None
        # How much of each job's output went to the log store, by (job, attempt).
        self._log_offsets: dict[tuple[str, int], int] = {}
        self._log_done: set[tuple[str, int]] = set()
        self._history_read_at: float | None = None
        # Why the history could not be read, until it is again ("": it was), and when.
        self._history_failed_at: float | None = None
        # Live jobs missing from the live listing: their end is read from the history.
        self._ended_unseen: set[tuple[str, int]] = set()
        self._passes_at_start = loop_passes() if loop_passes is not None else 0
        self._refresh_interval_s = refresh_interval_s
        self._unstartable_grace_s = (
            unstartable_grace_s
            if unstartable_grace_s is not None
            else UNSTARTABLE_GRACE_REFRESHES * refresh_interval_s
        )
        self._clock = clock
        self._instance_id = f"cluster-{uuid.uuid4().hex}"
        self._prefix = f"{name}."
        self.health = ClusterHealth()
        self._capacity: ClusterCapacity | None = None
        self._machines: dict[str, tuple[ClusterNode, str]] = {}  # node id -> (machine, partition)
        self._births: dict[str, NodeStatus] = {}
        self._seq: Counter[str] = Counter()
        self._documents: dict[str, DesiredState] = {}
        self._jobs: dict[tuple[str, int], ClusterJob] = {}
        # Jobs greenfed submitted (or adopted) this run: one that vanishes is reported.
        # "": submitted before this run, not seen since (whichever job of its name the
        # cluster lists is adopted; where its history has none, it vanished).
        self._submitted: dict[tuple[str, int], str] = {}
        self._vanished: dict[tuple[str, int], float] = {}
        self._refused: dict[tuple[str, int], str] = {}
        # Jobs waiting in the cluster's queue on a machine that takes no work: since when
        # (seen so at every refresh since), and those given up there (why, and when):
        # reported `stopped` while they still wait, never `starting` again.
        self._unstartable_since: dict[tuple[str, int], float] = {}
        self._given_up: dict[tuple[str, int], tuple[str, float]] = {}
        # Attempts the cluster is being asked to run right now (no job id yet), and
        # whether new ones wait (the cluster is being removed: `hold_submissions`).
        self._submitting: set[tuple[str, int]] = set()
        self._holding = False
        # Energy the cluster measured (Slurm's ConsumedEnergy): each job's last reading,
        # the GPUs it is shared over, and each GPU's cumulative counter, which its samples
        # carry as an agent's carry NVML's (cloud/usage/meter.py: measured, not modelled).
        self._job_energy_j: dict[tuple[str, int], float] = {}
        self._energy_devices: dict[tuple[str, int], tuple[tuple[str, str], ...]] = {}
        self._device_energy_j: dict[tuple[str, str], float] = {}
        # (machine, GPU type) whose count was past MAX_ACCELERATORS_PER_NODE (logged once).
        self._absurd_counts_logged: set[tuple[str, str]] = set()
        self._wake = asyncio.Event()

    # -- what the loop hands over ------------------------------------------------------

    def owns(self, node_id: str) -> bool:
        return node_id.startswith(self._prefix)

    def accept(self, document: DesiredState) -> bool:
        """Take the loop's document for one of this cluster's nodes; False: not ours."""
        if not self.owns(document.node_id):
            return False
        self._documents[document.node_id] = document
        self._wake.set()
        return True

    def node_id(self, machine: str) -> str:
        return f"{self._prefix}{machine}"

    # -- the loop ----------------------------------------------------------------------

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                await self.step()
            except Exception:  # a bug here must not end the cluster's bridge for good
                _log.exception("cluster bridge step failed", cluster=self.name)
            failures = 0 if self.health.reachable else failures + 1
            # A cluster that does not answer is asked less and less often, up to a minute.
            wait_s = min(MAX_RETRY_INTERVAL_S, self._refresh_interval_s * 2 ** min(failures, 6))
            if not failures:
                # A job just submitted is looked at often while it waits to start: it
                # shows running sooner (not for long: slurmctld answers everyone).
                now = self._clock()
                waiting = any(
                    job.state == "pending" and now - (job.submitted_at or 0.0) < FAST_REFRESH_FOR_S
                    for job in self._jobs.values()
                )
                wait_s = (
                    min(FAST_REFRESH_INTERVAL_S, self._refresh_interval_s)
                    if waiting
                    else (self._refresh_interval_s)
                )
            try:
                async with asyncio.timeout(wait_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()

    async def step(self) -> None:
        """One refresh and reconciliation; never raises for what the cluster does (a
        refusal of the commands that only read is taken as the cluster being away)."""
        try:
            capacity = await self.backend.capacity()
            history = self._history_due()
            jobs = await self.backend.jobs(include_ended=history)
            if history:
                history = self._history_answered()
            self._reached(capacity, jobs, with_history=history)
            self._judge_waiting()
        except (ClusterUnreachable, ClusterRefused) as error:
            self._unreachable(str(error))
        except Exception as error:
            # An answer that cannot be read (a record no parser foresaw) is the cluster
            # not answering usably: said as such, its nodes tainted, and this cluster's
            # reports and every other node's go on (never the bridge stopped for all).
            _log.exception("cluster answer unreadable", cluster=self.name)
            self._unreachable(f"the cluster's answer could not be read: {error!r}")
        else:
            try:
                await self._reconcile()
                await self._follow_output()
                self._prune()
            except ClusterUnreachable as error:
                self._unreachable(str(error))
            except Exception:  # a bug in reconciling must not silence the nodes too
                _log.exception("cluster reconciliation failed", cluster=self.name)
        self._announce()
        self._report()
        self._notify()

    def _history_due(self) -> bool:
        """Whether this step reads the cluster's history (slow: slurmdbd) too: at the
        first step (a restarted control plane adopts what ended meanwhile), when a job
        greenfed submitted is missing from the live listing, and every few minutes."""
        now = self._clock()
        if (
            self._history_failed_at is not None
            and now - self._history_failed_at < HISTORY_RETRY_INTERVAL_S
        ):
            return False
        if self._history_read_at is None:
            return True
        if self._ended_unseen:
            return True
        return now - self._history_read_at > HISTORY_INTERVAL_S

    def _history_answered(self) -> bool:
        """Whether the history was read with the listing just taken. Where it was not
        (slurmdbd away, slurmctld answering), the cluster is still reached: the jobs
        missing from its live listing keep their last known state until it is."""
        now = self._clock()
        if self.backend.history_error:
            self._history_failed_at = now
            return False
        if self._history_failed_at is not None:
            _log.info("cluster history read again", cluster=self.name)
        self._history_failed_at = None
        self._history_read_at = now
        return True

    def _unreachable(self, error: str) -> None:
        if self.health.reachable or not self.health.last_error:
            _log.warning("cluster unreachable", cluster=self.name, error=error[:300])
        self.health.reachable = False
        self.health.last_error = error[:1000]
        # What the cluster said of its machines before is not known to hold since.
        self._unstartable_since.clear()

    def _reached(
        self, capacity: ClusterCapacity, jobs: tuple[ClusterJob, ...], *, with_history: bool
    ) -> None:
        if not self.health.reachable:
            _log.info("cluster reachable", cluster=self.name, nodes=len(capacity.nodes))
        now = self._clock()
        self.health.reachable = True
        self.health.last_contact_at = now
        history_error = self.backend.history_error
        self.health.last_error = (
            "the cluster's job history could not be read (jobs gone from its live listing "
            f"keep their last known state until it is): {history_error}"[:1000]
            if history_error
            else ""
        )
        self.health.pending_jobs = capacity.pending_jobs
        self._capacity = capacity
        self._map_machines(capacity)
        latest: dict[tuple[str, int], ClusterJob] = {}
        for job in sorted(jobs, key=lambda j: int(j.backend_id) if j.backend_id.isdigit() else 0):
            key = (job.job_id, job.attempt)
            submitted = self._submitted.get(key)
            if submitted and job.backend_id != submitted:
                # Not the job greenfed submitted (or adopted) for that attempt: another
                # of that name (a user's, faking greenfed's name and comment) never
                # stands in for it, whatever its state.
                continue
            latest[key] = job  # the newest of a name wins (adopted after a restart)
        for key, backend_id in self._submitted.items():
            if key in latest or key in self._vanished:
                continue
            if not with_history:
                # Not in the live listing: an ended job aged out of it keeps its known
                # end; a live one's end is in the history, which the next step reads.
                known = self._jobs.get(key)
                if known is not None:
                    latest[key] = known
                    if _live(known):
                        self._ended_unseen.add(key)
                continue
            _log.warning("cluster job vanished", cluster=self.name, key=key, backend_id=backend_id)
            self._vanished[key] = now
        if with_history:
            self._ended_unseen.clear()
        self._jobs = latest
        self._count_energy()
        self.health.jobs_running = sum(job.state == "running" for job in latest.values())

    def _count_energy(self) -> None:
        """Each job's newly measured energy onto the counters of the GPUs it holds, in
        equal parts (the cluster measures a job, not its GPUs one by one)."""
        for key, job in self._jobs.items():
            if job.consumed_energy_j is None:
                continue
            if not _live(job):
                # Its final reading comes after it ended (sacct's history): its GPUs may
                # be another tenant's by now, whose meter would be billed for it. Seen,
                # never counted: at most a refresh of an ended job's energy goes unbilled.
                if key in self._job_energy_j:
                    self._job_energy_j[key] = max(self._job_energy_j[key], job.consumed_energy_j)
                continue
            devices = self._energy_devices.get(key)
            if devices is None:
                devices = tuple(
                    (node_id, device)
                    for node_id, document in self._documents.items()
                    for training in document.training
                    if (training.job_id, training.attempt) == key
                    for device in training.accelerator_ids
                    if not device.startswith("cpu")
                )
                if not devices:
                    continue  # its documents have not come yet: the next reading
                self._energy_devices[key] = devices
                for device in devices:  # a counter from here on; what came before was modelled
                    self._device_energy_j.setdefault(device, 0.0)
                self._job_energy_j[key] = job.consumed_energy_j
                continue
            delta_j = job.consumed_energy_j - self._job_energy_j[key]
            if delta_j <= 0:
                continue
            self._job_energy_j[key] = job.consumed_energy_j
            for device in devices:
                self._device_energy_j[device] += delta_j / len(devices)

    # -- nodes -------------------------------------------------------------------------

    def _held_accelerators(self, node_id: str) -> tuple[set[str], set[str]]:
        """(held, claimed) accelerator ids on that node: those of greenfed's jobs the
        cluster runs (sampled busy: what the energy model bills), and those greenfed's
        documents give its live or not yet submitted work plus the ones of its jobs that
        ended within LINGER_S (the birth's: nothing else is placed on them; the cluster
        may still show an ended job's allocated while it completes it: they are not
        others' work). A job waiting in the cluster's queue holds no GPU there: it is
        not billed for one."""
        document = self._documents.get(node_id)
        if document is None:
            return set(), set()
        held: set[str] = set()
        claimed: set[str] = set()
        now = self._clock()
        for training in document.training:
            key = (training.job_id, training.attempt)
            job = self._jobs.get(key)
            if job is None or _live(job) or key not in self._submitted:
                claimed.update(training.accelerator_ids)
                if job is not None and job.state == "running":
                    held.update(training.accelerator_ids)
            elif job.finished_at is not None and now - job.finished_at < LINGER_S:
                claimed.update(training.accelerator_ids)
        return held, claimed

    def _map_machines(self, capacity: ClusterCapacity) -> None:
        """Which node each usable machine is, in which partition (before reconciling:
        gangs are formed on them): the first greenfed may use that is up, else the first
        it may use, the machine then taking no work (`_usable`)."""
        skipped: list[str] = []
        machines: dict[str, tuple[ClusterNode, str]] = {}
        for machine in capacity.nodes:
            usable = [
                p for p in machine.partitions if not self._partitions or p in self._partitions
            ]
            if not usable:
                continue
            node_id = self.node_id(machine.name)
            if not is_valid_node_id(node_id):  # a name no topic level can hold
                skipped.append(machine.name[:128])
                continue
            machines[node_id] = self._usable(machine, usable)
        self._machines = machines
        self.health.nodes = len(machines)
        self.health.skipped_machines = tuple(skipped)

    @staticmethod
    def _usable(machine: ClusterNode, usable: list[str]) -> tuple[ClusterNode, str]:
        """The machine as greenfed may use it, and the partition work goes through. A
        machine whose partitions greenfed may use are none of them up takes no work
        (`unavailable`, saying which), though another of its partitions is: a job placed
        there would wait in a partition that starts nothing."""
        up = [p for p in usable if machine.takes_work_in(p)]
        if up:
            return machine, up[0]
        if not machine.unavailable:
            down = {p: machine.partition_availability.get(p, "unknown") for p in usable}
            machine = dataclasses.replace(machine, unavailable=partitions_not_up(down))
        return machine, usable[0]

    def _announce(self) -> None:
        """A birth for every machine (again where anything changed), telemetry for all."""
        models: Counter[str] = Counter()
        unknown: Counter[str] = Counter()
        # Until the loop has handed over every document (a restart), the GPUs greenfed's
        # running jobs hold cannot be told from others': on the machines they run on, no
        # GPU is called busy (else the loop would take its own work's GPUs as failed).
        unsure = (
            set()
            if self._knows_every_document()
            else {machine for job in self._jobs.values() if _live(job) for machine in job.nodes}
        )
        for node_id, (machine, partition) in self._machines.items():
            # A job that just ended may still hold its GPUs in the cluster's listing
            # (read before the job's, or while Slurm completes it): calling them others'
            # would make the loop take the job's end for a failed GPU and run it again.
            held, claimed = self._held_accelerators(node_id)
            status = self._birth(
                node_id, machine, partition, claimed, models, unknown, unsure=machine.name in unsure
            )
            if self._births.get(node_id) != status:
                self._births[node_id] = status
                self._registry.apply_status(status)
            self._seq[node_id] += 1
            sample = self._sample(node_id, status, held, claimed - held)
            if not isinstance(self._registry.apply_telemetry(sample), Rejection):
                for listener in self._telemetry_listeners:
                    listener(sample)
        if self._capacity is not None:
            self.health.accelerators = dict(models)
            self.health.unknown_accelerator_types = dict(unknown)

    def _birth(
        self,
        node_id: str,
        machine: ClusterNode,
        partition: str,
        held: set[str],
        models: Counter[str],
        unknown: Counter[str],
        *,
        unsure: bool = False,
    ) -> NodeStatus:
        """`held`: the GPUs greenfed's work holds there (`_held_accelerators`); `unsure`:
        which of the allocated GPUs are greenfed's is not known yet (none called busy)."""
        zone, region = self._placement.of(partition)
        accelerators: list[Accelerator] = []
        for type_name, count in sorted(machine.accelerators.items()):
            if not 0 <= count <= MAX_ACCELERATORS_PER_NODE:
                # A broken record (the back-end's parser lets none through): one entry
                # per GPU would be built by the hundred thousand, every refresh.
                if (machine.name, type_name) not in self._absurd_counts_logged:
                    self._absurd_counts_logged.add((machine.name, type_name))
                    _log.warning(
                        "cluster machine's GPUs left out: an absurd count",
                        cluster=self.name,
                        machine=machine.name[:128],
                        type=type_name[:64],
                        count=count,
                    )
                continue
            facts = accelerator_facts(type_name, self._gres_models)
            if facts is None:
                unknown[type_name] += count
                continue
            models[facts.name] += count
            offset = len(accelerators)
            ids = [f"gpu{offset + index}" for index in range(count)]
            # GPUs Slurm gave to others: that many of those greenfed's work does not hold.
            ours = sum(1 for device in ids if device in held)
            others = 0 if unsure else max(0, machine.allocated.get(type_name, 0) - ours)
            busy = [device for device in ids if device not in held][:others]
            for index, device in enumerate(ids):
                accelerators.append(
                    Accelerator(
                        id=device,
                        kind=facts.kind,
                        vendor=facts.vendor,
                        model=facts.name,
                        memory_bytes=facts.memory_bytes or 0,
                        compute_units=facts.compute_units or 0,
                        idle_power_w=facts.idle_power_w,
                        max_power_w=facts.max_power_w,
                        relative_speed=facts.relative_speed,
                        index=offset + index,
                        healthy=device not in busy,
                        health=OTHER_WORK if device in busy else "",
                    )
                )
        accelerators.append(
            Accelerator(
                id="cpu0",
                kind="cpu",
                vendor="unknown",
                model=f"{self.name} {partition}",
                memory_bytes=machine.memory_bytes,
                compute_units=machine.cpus,
            )
        )
        taints = []
        if not self.health.reachable:
            taints.append(NodeTaint(key=UNREACHABLE_TAINT, value="true", effect="NoSchedule"))
        elif machine.unavailable:
            taints.append(NodeTaint(key=UNAVAILABLE_TAINT, value="true", effect="NoSchedule"))
        now = self._clock()
        previous = self._births.get(node_id)
        return NodeStatus(
            node_id=node_id,
            state="online",
            instance_id=self._instance_id,
            agent_version=__version__,
            site="cloud",
            zone=zone,
            region=region,
            labels={
                CLUSTER_LABEL: self.name,
                "slurm.partition": partition,
                "slurm.node": machine.name,
            },
            host=HostInfo(
                hostname=machine.name,
                os="Linux",
                arch="unknown",
                cpu_logical_cores=machine.cpus,
                memory_total_bytes=machine.memory_bytes,
            ),
            accelerators=tuple(accelerators),
            telemetry_interval_s=self._refresh_interval_s,
            started_at=previous.started_at if previous is not None else now,
            sent_at=previous.sent_at if previous is not None else now,
            runs_training=True,
            taints=tuple(taints),
            isolation="none",
            sealing_public_key=self._sealing_public_key,
            isolation_note=(
                f"run by cluster {self.name}'s scheduler under the account greenfed submits "
                "with; the cluster confines each job to its allocation"
            ),
        )

    def _sample(
        self, node_id: str, status: NodeStatus, held: set[str], waiting: set[str]
    ) -> Telemetry:
        """`held`: the GPUs of greenfed's jobs the cluster runs (busy); `waiting`: those
        claimed for its work that does not run (waiting in the cluster's queue or to be
        submitted, or just ended), on which greenfed draws nothing (`_drawing_nothing`).
        The machine's CPU is not sampled: its host share is modelled."""
        samples = [
            self._drawing_nothing(node_id, accelerator.id)
            if accelerator.id in waiting
            else AcceleratorSample(
                id=accelerator.id,
                utilization_pct=100.0 if accelerator.id in held else 0.0,
                memory_used_bytes=0,
                energy_j=self._device_energy_j.get((node_id, accelerator.id)),
            )
            for accelerator in status.accelerators
            if accelerator.kind != "cpu"
        ]
        return Telemetry(
            node_id=node_id,
            instance_id=self._instance_id,
            seq=self._seq[node_id],
            sampled_at=self._clock(),
            interval_s=self._refresh_interval_s,
            cpu_utilization_pct=0.0,
            memory_used_bytes=0,
            memory_total_bytes=status.host.memory_total_bytes,
            accelerators=tuple(samples),
        )

    def _drawing_nothing(self, node_id: str, device: str) -> AcceleratorSample:
        """A device greenfed holds nothing on: 0 W, and an energy counter that does not
        move (the one the cluster's measured energy keeps, else 0). Usage metering then
        bills the work placed there nothing while it waits, gaps between samples
        included (a refresh that took long, a cluster that did not answer): a counter's
        difference covers them, where the energy model would fill them at the device's
        idle power (cloud/usage/meter.py)."""
        return AcceleratorSample(
            id=device,
            utilization_pct=0.0,
            memory_used_bytes=0,
            power_w=0.0,
            energy_j=self._device_energy_j.get((node_id, device), 0.0),
        )

    # -- work --------------------------------------------------------------------------

    def _gangs(self) -> dict[tuple[str, int], GangRequest]:
        members: dict[tuple[str, int], list[tuple[str, DesiredTraining]]] = {}
        for node_id, document in self._documents.items():
            for training in document.training:
                members.setdefault((training.job_id, training.attempt), []).append(
                    (node_id, training)
                )
        gangs = {}
        for key, entries in members.items():
            gang = self._gang(sorted(entries, key=lambda entry: entry[1].node_rank))
            if gang is not None:
                gangs[key] = gang
        return gangs

    def _gang(self, entries: list[tuple[str, DesiredTraining]]) -> GangRequest | None:
        """The cluster job of one attempt, once every node of the gang has its document."""
        first = entries[0][1]
        if len(entries) < first.nodes:
            return None  # a member's document has not come yet: the next pass
        machines = [self._machines.get(node_id) for node_id, _ in entries]
        if any(machine is None for machine in machines):
            return None
        if any(node_id not in self._births for node_id, _ in entries):
            return None  # not announced yet (the first step): its GPUs' types unknown
        partition = machines[0][1]  # type: ignore[index]
        accelerator_type = None
        for node_id, training in entries:
            machine = self._machines[node_id][0]
            type_name = self._type_of(machine, training.accelerator_ids, node_id)
            if type_name is not None:
                accelerator_type = type_name
        time_limit_s = None
        if first.reference_duration_s is not None:
            speed = min(
                (a.relative_speed or 1.0 for a in self._births[entries[0][0]].accelerators
                 if a.id in first.accelerator_ids),
                default=1.0,
            )  # fmt: skip
            time_limit_s = max(
                _MIN_TIME_LIMIT_S, _TIME_LIMIT_FACTOR * first.reference_duration_s / speed
            )
        if self._max_time_limit_s is not None:
            time_limit_s = min(time_limit_s or self._max_time_limit_s, self._max_time_limit_s)
        return GangRequest(
            job_id=first.job_id,
            attempt=first.attempt,
            tenant=first.tenant,
            partition=partition,
            members=tuple(
                GangMember(
                    node=self._machines[node_id][0].name,
                    processes=training.processes,
                    accelerators=sum(1 for a in training.accelerator_ids if a.startswith("gpu")),
                    cpus=training.cpu_cores or 0,
                    host_memory_bytes=(training.host_memory_bytes or 0) * training.processes,
                )
                for node_id, training in entries
            ),
            accelerator_type=accelerator_type,
            command=first.command,
            env=first.env,
            working_dir=first.working_dir,
            master_port=first.master_port or 29500,
            per_node=first.launch == "per-node",
            time_limit_s=time_limit_s,
            priority="p1",
            grace_period_s=first.grace_period_s,
        )

    def _type_of(self, machine: ClusterNode, ids: tuple[str, ...], node_id: str) -> str | None:
        """The cluster's type name of the GPUs `ids` name on that machine."""
        birth = self._births.get(node_id)
        if birth is None:
            return None
        models = {a.model for a in birth.accelerators if a.id in ids and a.kind != "cpu"}
        for type_name in machine.accelerators:
            facts = accelerator_facts(type_name, self._gres_models)
            if facts is not None and facts.name in models:
                return type_name
        return None

    async def _reconcile(self) -> None:
        gangs = self._gangs()
        for key, gang in gangs.items():
            if key in self._jobs:
                if not self._submitted.get(key):
                    self._submitted[key] = self._jobs[key].backend_id
                continue
            if key in self._submitted or key in self._refused or key in self._vanished:
                continue  # submitted once: what became of it is the cluster's to say
            if not self._documents_current(gang):
                continue
            gang = self._with_hints(gang)
            try:
                gang = self._with_secrets(gang)
            except SealedSecretsError as error:
                self._refused[key] = f"its secrets do not open: {error}"
                continue
            if self._holding:
                continue
            self._submitting.add(key)
            try:
                await self._submit(key, gang)
            finally:
                self._submitting.discard(key)
        named = {
            (training.job_id, training.attempt)
            for document in self._documents.values()
            for training in document.training
        }
        for key, job in list(self._jobs.items()):
            if _live(job) and key not in named and self._knows_every_document():
                _log.info(
                    "cluster job cancelled: no longer desired",
                    cluster=self.name,
                    job_id=job.job_id,
                    attempt=job.attempt,
                    backend_id=job.backend_id,
                )
                await self.backend.cancel(job)
                self._jobs[key] = ClusterJob(
                    backend_id=job.backend_id,
                    job_id=job.job_id,
                    attempt=job.attempt,
                    state="stopped",
                    reason="cancelled by greenfed",
                    finished_at=self._clock(),
                )

    async def _submit(self, key: tuple[str, int], gang: GangRequest) -> None:
        if not await self._claim(key):
            return
        try:
            backend_id = await self.backend.submit(gang)
        except ClusterRefused as error:
            _log.warning("cluster refused a job", cluster=self.name, key=gang.key, error=str(error))
            self._refused[key] = str(error)
            return
        self._submitted[key] = backend_id
        self._jobs[key] = ClusterJob(
            backend_id=backend_id,
            job_id=gang.job_id,
            attempt=gang.attempt,
            state="pending",
            submitted_at=self._clock(),
        )

    async def _claim(self, key: tuple[str, int]) -> bool:
        """Whether the attempt may be submitted now: claimed in the store first, so that
        no later run submits it again. One claimed before this run (a restart, another
        replica that led) was submitted and is no longer listed: its end is looked for in
        the cluster's history, and where none is there it vanished."""
        if self._claim_submission is None or key in self._claimed:
            return True
        try:
            claimed = await self._claim_submission(*key)
        except Exception as error:  # the store away: not submitted, asked at the next step
            _log.warning(
                "cluster job not submitted: its submission could not be recorded",
                cluster=self.name,
                key=key,
                error=str(error)[:300],
            )
            return False
        if claimed:
            self._claimed.add(key)
            return True
        _log.warning(
            "cluster job submitted before and no longer listed: not submitted again",
            cluster=self.name,
            key=key,
        )
        self._submitted[key] = ""
        self._ended_unseen.add(key)
        return False

    def _with_hints(self, gang: GangRequest) -> GangRequest:
        """The gang with its job's priority, and a time limit no later than its deadline
        (from memory: a step that is cancelled never leaves a store read behind)."""
        hints = self._work_hints(gang.job_id) if self._work_hints is not None else None
        if hints is None:
            return gang
        time_limit_s = gang.time_limit_s
        if hints.deadline_at is not None:
            until_deadline_s = max(60.0, hints.deadline_at - self._clock())
            time_limit_s = min(time_limit_s or until_deadline_s, until_deadline_s)
        return dataclasses.replace(gang, priority=hints.priority, time_limit_s=time_limit_s)

    def _with_secrets(self, gang: GangRequest) -> GangRequest:
        """The gang with its job's secrets opened (sealed to the first member's node);
        raises SealedSecretsError where they do not open."""
        node_id = self.node_id(gang.members[0].node)
        training = next(
            t
            for t in self._documents[node_id].training
            if (t.job_id, t.attempt) == (gang.job_id, gang.attempt)
        )
        if training.sealed_secrets is None and not training.secret_names:
            return gang
        opened = open_worker_secrets(training, self._sealing_key, node_id)
        return dataclasses.replace(gang, secret_env=dict(opened.env))

    async def _follow_output(self) -> None:
        """New output of greenfed's cluster jobs into the log store (`greenfed logs`),
        until a job that ended has none left."""
        if self._on_log is None:
            return
        for key, job in self._jobs.items():
            if key in self._log_done or key not in self._submitted:
                continue
            if job.output_path is None or not job.nodes:
                continue
            offset = self._log_offsets.get(key, 0)
            data = await self.backend.read_output(job, offset, MAX_LOG_READ_BYTES)
            text, used = _complete_utf8(data)
            if text:
                self._on_log(
                    JobLogChunk(
                        node_id=self.node_id(job.nodes[0]),
                        job_id=job.job_id,
                        attempt=job.attempt,
                        offset=offset,
                        text=text,
                        sent_at=self._clock(),
                    )
                )
                self._log_offsets[key] = offset + used
            elif not _live(job):
                self._log_done.add(key)

    def _prune(self) -> None:
        """Forget the attempts no document names any more once they ended and their
        output was read (their reports went with their documents): a bridge that runs
        for months keeps what its documents and the cluster's listing hold, not every
        job it ever ran. Only once every document is known (a restart hands them over
        again first)."""
        if not self._knows_every_document():
            return
        named = {
            (training.job_id, training.attempt)
            for document in self._documents.values()
            for training in document.training
        }
        tracked = (
            self._submitted.keys()
            | self._vanished.keys()
            | self._refused.keys()
            | self._log_offsets.keys()
            | self._log_done
            | self._job_energy_j.keys()
            | self._energy_devices.keys()
            | self._ended_unseen
            | self._claimed
            | self._unstartable_since.keys()
            | self._given_up.keys()
            | self._jobs.keys()
        )
        for key in tracked - named:
            job = self._jobs.get(key)
            if job is not None and (_live(job) or not self._output_done(key, job)):
                continue
            self._submitted.pop(key, None)
            self._vanished.pop(key, None)
            self._refused.pop(key, None)
            self._log_offsets.pop(key, None)
            self._log_done.discard(key)
            self._job_energy_j.pop(key, None)
            self._energy_devices.pop(key, None)
            self._ended_unseen.discard(key)
            self._claimed.discard(key)
            self._unstartable_since.pop(key, None)
            self._given_up.pop(key, None)
            # Back with the next listing while the cluster still lists it (not as
            # greenfed's submission: never reported vanished, never followed).
            self._jobs.pop(key, None)

    def _output_done(self, key: tuple[str, int], job: ClusterJob) -> bool:
        """Whether an ended job's output has all gone to the log store (or never will:
        no log store, not greenfed's submission, no file: `_follow_output`)."""
        if self._on_log is None or key not in self._submitted:
            return True
        return key in self._log_done or job.output_path is None or not job.nodes

    def _documents_current(self, gang: GangRequest) -> bool:
        return all(self.node_id(member.node) in self._documents for member in gang.members)

    def _knows_every_document(self) -> bool:
        # A pass that began before the bridge started may end after it: two.
        passes = self._loop_passes
        return passes is None or passes() >= self._passes_at_start + 2

    def _chosen_machines(self) -> dict[tuple[str, int], set[str]]:
        """The machines the loop placed each attempt on, by its documents."""
        chosen: dict[tuple[str, int], set[str]] = {}
        for node_id, document in self._documents.items():
            for training in document.training:
                machine = node_id.removeprefix(self._prefix)
                chosen.setdefault((training.job_id, training.attempt), set()).add(machine)
        return chosen

    def _judge_waiting(self) -> None:
        """Give up on the jobs that have waited in the cluster's queue for
        `unstartable_grace_s` where they cannot start (`_why_unstartable`): the cluster
        would hold them there for ever, and the loop places them elsewhere only once
        they are reported `stopped`."""
        now = self._clock()
        for key, machines in self._chosen_machines().items():
            if key in self._given_up:
                continue
            job = self._jobs.get(key)
            why = self._why_unstartable(job, machines) if job is not None else ""
            if not why:
                self._unstartable_since.pop(key, None)
                continue
            since = self._unstartable_since.setdefault(key, now)
            if now - since < self._unstartable_grace_s:
                continue
            _log.warning(
                "cluster job given up: its machine takes no work",
                cluster=self.name,
                job_id=key[0],
                attempt=key[1],
                reason=why,
            )
            self._given_up[key] = (why, now)

    def _why_unstartable(self, job: ClusterJob, machines: set[str]) -> str:
        """Why a job waiting in the cluster's queue, placed on `machines`, cannot start
        there ("": it may, or it runs): one of them takes no work (not where the cluster
        picks the machines itself: it runs the job on others), or the cluster's own
        pending reason says so (its partition down, its machines not available).
        Resources, priority and the like wait their turn: never given up for."""
        if job.state != "pending":
            return ""
        if self.backend.pins_machines is not False:
            for machine in sorted(machines):
                mapped = self._machines.get(self.node_id(machine))
                if mapped is not None and mapped[0].unavailable:
                    return (
                        f"machine {machine} of cluster {self.name} takes no work "
                        f"({mapped[0].unavailable[:300]}): the job waiting in its queue "
                        "cannot start there"
                    )
        if job.queue_wait == "cannot_start":
            return (
                f"cluster {self.name} cannot start the job where it waits in its queue "
                f"({job.reason[:300]})"
            )
        return ""

    def _report(self) -> None:
        now = self._clock()
        chosen = self._chosen_machines()
        for node_id, document in self._documents.items():
            if node_id not in self._births:
                continue
            entries = tuple(
                self._reported(training, now, chosen[(training.job_id, training.attempt)])
                for training in document.training
            )
            self._registry.apply_reported(
                ReportedState(
                    node_id=node_id,
                    instance_id=self._instance_id,
                    observed_generation=document.generation,
                    reported_at=now,
                    training=entries,
                    cluster_id=document.cluster_id,
                )
            )

    def _reported(
        self, training: DesiredTraining, now: float, chosen: set[str]
    ) -> ReportedTraining:
        """`chosen`: the machines the loop placed the entry's job on."""
        key = (training.job_id, training.attempt)
        state: TrainingRunState
        if key in self._refused:
            return ReportedTraining(
                job_id=training.job_id,
                attempt=training.attempt,
                state="failed",
                reason=f"cluster {self.name} refused the job: {self._refused[key]}"[:1000],
                finished_at=now,
            )
        if key in self._vanished:
            return ReportedTraining(
                job_id=training.job_id,
                attempt=training.attempt,
                state="failed",
                reason=f"the job disappeared from cluster {self.name} (deleted outside greenfed?)",
                finished_at=self._vanished[key],
            )
        job = self._jobs.get(key)
        if job is not None and job.state == "pending" and key in self._given_up:
            why, given_up_at = self._given_up[key]
            return ReportedTraining(
                job_id=training.job_id,
                attempt=training.attempt,
                state="stopped",
                reason=why[:1000],
                finished_at=given_up_at,
            )
        if job is None:
            return ReportedTraining(
                job_id=training.job_id,
                attempt=training.attempt,
                state="starting",
                reason=(
                    f"submitted to cluster {self.name} before: looking for it in its history"
                    if key in self._submitted
                    else ""
                ),
            )
        if job.state == "pending":
            state = "starting"
            # The cluster's own queue (anyone's jobs) says how long it may be.
            reason = (
                f"waiting in cluster {self.name}'s queue "
                f"({self.health.pending_jobs} jobs pending there)"
            ) + (f": {job.reason}" if job.reason else "")
        else:
            state = job.state
            reason = job.reason
        if job.nodes and set(job.nodes) != chosen:
            # A cluster that cannot be told the machines (slurmrestd v0.0.38) placed it
            # itself: where it runs is said, not hidden.
            where = (
                f"cluster {self.name} runs it on {', '.join(job.nodes)}, not on "
                f"{', '.join(sorted(chosen))} as greenfed chose"
            )
            reason = f"{reason}; {where}" if reason else where
        return ReportedTraining(
            job_id=training.job_id,
            attempt=training.attempt,
            state=state,
            exit_code=job.exit_code,
            reason=reason[:1000],
            started_at=job.started_at,
            finished_at=job.finished_at,
            power_limit_note=(
                f"cluster {self.name} does not cap GPU power: the job runs at the GPUs' "
                "default limit (energy is modelled at it)"
                if training.power_limit_w is not None
                else ""
            ),
        )

    def job_of(self, job_id: str, attempt: int) -> ClusterJob | None:
        return self._jobs.get((job_id, attempt))

    def hold_submissions(self, holding: bool) -> None:
        """Submit nothing new while `holding` (a removal checks `live_jobs`, then forgets
        the cluster: nothing may start in between)."""
        self._holding = holding

    def live_jobs(self) -> dict[tuple[str, int], str]:
        """greenfed's attempts the cluster runs (`running`), holds in its queue
        (`pending`) or is being asked to run right now (`submitting`), as last known: a
        job waiting there runs later, whatever greenfed has decided meanwhile."""
        live: dict[tuple[str, int], str] = {
            key: job.state for key, job in self._jobs.items() if _live(job)
        }
        live.update((key, "submitting") for key in self._submitting if key not in live)
        return live
