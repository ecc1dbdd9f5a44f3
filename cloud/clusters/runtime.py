"""The registered clusters of a running control plane: a bridge (cloud/clusters/
bridge.py) per cluster in the store, started and stopped as admins register and
remove them here or on another replica (the store is read again every few seconds).

Every replica runs every bridge: each sees the clusters' machines as nodes. Only the
scheduling leader hands documents over (cloud/loop/publisher.py `diverted`), so only
it submits and cancels cluster jobs, each attempt claimed in the store first
(`claim_submission`): the next leader, or this one restarted, never submits it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

import msgspec
import structlog
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cloud.clusters.backend import ClusterBackend
from cloud.clusters.bridge import ClusterBridge, ClusterPlacement, WorkHints
from cloud.clusters.credentials import rest_token, shown
from cloud.clusters.slurm.backend import SlurmBackend
from cloud.clusters.slurm.commands import SlurmAccess, SlurmCommands
from cloud.clusters.slurm.rest_backend import SlurmRestBackend
from cloud.clusters.slurm.rest_client import SlurmRestAccess, SlurmRestClient
from cloud.clusters.slurm.script import SubmitOptions
from cloud.clusters.views import ClusterSpec, ClusterView
from cloud.fleet.registry import NodeRegistry
from cloud.secrets.at_rest import SecretNotOpenedError, SecretsAtRest
from cloud.store import WorkRecord
from cloud.store.clusters import ClusterRecord
from shared.clock import utc_from_epoch
from shared.enrolment_certificate import derived_x25519_key
from shared.messages import DesiredState, JobLogChunk, Telemetry
from shared.tasks import cancel_and_wait

RELOAD_INTERVAL_S: Final = 3.0
CLUSTER_SEALING_KEY_PURPOSE: Final = b"greenfed/v1 cluster sealing key"

_log = structlog.get_logger("greenfed.clusters")


def hints_from(record: WorkRecord | None) -> WorkHints | None:
    """A job's priority and deadline (when a cluster job is submitted)."""
    if record is None:
        return None
    deadline = msgspec.json.decode(record.spec).get("deadline")
    deadline_at = None
    if isinstance(deadline, str):
        with contextlib.suppress(ValueError):
            deadline_at = datetime.fromisoformat(deadline.replace("Z", "+00:00")).timestamp()
    return WorkHints(priority=record.priority, deadline_at=deadline_at)


def backend_of(spec: ClusterSpec, token: str = "") -> ClusterBackend:
    """The cluster's back-end: through its slurmrestd where the registration names one,
    else through its commands. `token`: the registration's slurmrestd JWT, opened."""
    access = spec.slurm
    options = SubmitOptions(
        work_dir=access.work_dir,
        account=access.account,
        qos={str(priority): qos for priority, qos in access.qos.items()},
        nice={str(priority): nice for priority, nice in access.nice.items()},
    )
    if access.rest_url:
        return SlurmRestBackend(
            SlurmRestClient(
                SlurmRestAccess(url=access.rest_url, user_name=access.rest_user, token=token)
            ),
            options,
        )
    return SlurmBackend(
        SlurmCommands(
            SlurmAccess(ssh=access.ssh, slurm_conf=access.slurm_conf, bin_dir=access.bin_dir)
        ),
        options,
    )


@dataclass(slots=True)
class _Running:
    record: ClusterRecord
    bridge: ClusterBridge
    task: asyncio.Task[None]


class ClusterFleet:
    def __init__(
        self,
        registry: NodeRegistry,
        *,
        notify: Callable[[], None],
        loop_passes: Callable[[], int] | None = None,
        work_hints: Callable[[str], WorkHints | None] | None = None,
        on_log: Callable[[JobLogChunk], None] | None = None,
        telemetry_listeners: Sequence[Callable[[Telemetry], None]] = (),
        backend_factory: Callable[[ClusterSpec, str], ClusterBackend] = backend_of,
        claim_submission: Callable[[str, str, int], Awaitable[bool]] | None = None,
    ) -> None:
        """`claim_submission(cluster, job_id, attempt)`: the store's
        `claim_cluster_submission` (None: each bridge's memory alone)."""
        self._registry = registry
        self._claim_submission = claim_submission
        self._notify = notify
        self._loop_passes = loop_passes
        self._work_hints = work_hints
        self._on_log = on_log
        self._telemetry_listeners = telemetry_listeners
        # Told of every bridge that starts (the publisher hands its nodes' documents
        # over again: cloud/loop/publisher.py `resend`).
        self.started_listeners: list[Callable[[ClusterBridge], None]] = []
        self._backend_factory = backend_factory
        self._running: dict[str, _Running] = {}
        # What clusters that accept secrets open them with, and what opens the stored
        # credentials of clusters (set at start: `use_keys`).
        self._sealing_key: X25519PrivateKey | None = None
        self._secrets_at_rest: SecretsAtRest | None = None

    def use_keys(
        self, signing_key: Ed25519PrivateKey, secrets_at_rest: SecretsAtRest | None = None
    ) -> None:
        """The control plane's signing key, from which clusters' sealing key derives
        (every replica derives the same one), and its secrets key (cluster credentials)."""
        self._sealing_key = derived_x25519_key(signing_key, CLUSTER_SEALING_KEY_PURPOSE)
        self._secrets_at_rest = secrets_at_rest

    def accept(self, document: DesiredState) -> bool:
        """The loop's document for a cluster's node goes to its bridge; False: not one."""
        return any(running.bridge.accept(document) for running in self._running.values())

    def bridge(self, name: str) -> ClusterBridge | None:
        running = self._running.get(name)
        return None if running is None else running.bridge

    def bridge_of_node(self, node_id: str) -> ClusterBridge | None:
        for running in self._running.values():
            if running.bridge.owns(node_id):
                return running.bridge
        return None

    async def adopt(self, records: tuple[ClusterRecord, ...]) -> None:
        """Run a bridge for each record, stop those of clusters no longer registered."""
        wanted = {record.spec.name: record for record in records}
        for name in list(self._running):
            if name not in wanted or wanted[name].spec != self._running[name].record.spec:
                await self._stop(name)
        for name, record in wanted.items():
            if name not in self._running:
                self._start(record)

    def _start(self, record: ClusterRecord) -> None:
        spec = record.spec
        try:
            token = rest_token(spec, self._secrets_at_rest)
        except SecretNotOpenedError as error:  # slurmrestd will refuse: the view says why
            _log.error("cluster credentials do not open", cluster=spec.name, error=str(error))
            token = ""
        bridge = ClusterBridge(
            spec.name,
            self._backend_factory(spec, token),
            self._registry,
            ClusterPlacement(
                zone=spec.zone,
                region=spec.region,
                partitions={
                    name: (placement.zone, placement.region)
                    for name, placement in spec.partitions.items()
                    if placement is not None
                },
            ),
            partitions=tuple(spec.partitions),
            gres_models=spec.gres_models,
            notify=self._notify,
            loop_passes=self._loop_passes,
            work_hints=self._work_hints,
            on_log=self._on_log,
            telemetry_listeners=self._telemetry_listeners,
            sealing_key=self._sealing_key if spec.accepts_secrets else None,
            max_time_limit_s=spec.slurm.max_time_limit_s,
            claim_submission=(
                functools.partial(self._claim_submission, spec.name)
                if self._claim_submission is not None
                else None
            ),
            refresh_interval_s=spec.refresh_interval_s,
        )
        task = asyncio.create_task(bridge.run(), name=f"cluster-{spec.name}")
        self._running[spec.name] = _Running(record, bridge, task)
        for listener in self.started_listeners:
            listener(bridge)
        _log.info("cluster bridge started", cluster=spec.name, kind=spec.kind)

    async def _stop(self, name: str) -> None:
        running = self._running.pop(name)
        await cancel_and_wait([running.task])
        await running.bridge.backend.close()
        owned = [r.node_id for r in self._registry.nodes() if running.bridge.owns(r.node_id)]
        for node_id in owned:
            self._registry.forget(node_id)
        self._notify()
        _log.info("cluster bridge stopped", cluster=name, nodes_forgotten=len(owned))

    async def run(self, load: Callable[[], Awaitable[tuple[ClusterRecord, ...]]]) -> None:
        """Follow the store's registrations until cancelled; stop every bridge then."""
        try:
            while True:
                try:
                    await self.adopt(await load())
                except Exception as error:  # the store is briefly away: keep what runs
                    _log.warning("clusters not reloaded", error=str(error)[:300])
                await asyncio.sleep(RELOAD_INTERVAL_S)
        finally:
            for name in list(self._running):
                with contextlib.suppress(Exception):
                    await self._stop(name)

    def view(self, record: ClusterRecord) -> ClusterView:
        running = self._running.get(record.spec.name)
        health = running.bridge.health if running is not None else None
        return ClusterView(
            spec=shown(record.spec),
            created_at=utc_from_epoch(record.created_at),
            created_by=record.created_by,
            reachable=health.reachable if health else False,
            last_contact_at=(
                utc_from_epoch(health.last_contact_at)
                if health and health.last_contact_at is not None
                else None
            ),
            last_error=health.last_error if health else "not started yet",
            nodes=health.nodes if health else 0,
            accelerators=dict(health.accelerators) if health else {},
            unknown_accelerator_types=dict(health.unknown_accelerator_types) if health else {},
            skipped_machines=health.skipped_machines if health else (),
            pending_jobs=health.pending_jobs if health else 0,
            greenfed_jobs_running=health.jobs_running if health else 0,
            interface=running.bridge.backend.interface if running is not None else "",
            pins_machines=running.bridge.backend.pins_machines if running is not None else None,
        )
