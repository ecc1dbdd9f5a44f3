"""How much energy a job or a replica needs on each candidate node.

Per accelerator the model is linear in utilisation u (0..1):

    P(u) = idle_power_w + (max_power_w - idle_power_w) · u

and a member (gang worker or replica) holding ``a`` accelerators of a pool draws

    P_member = a · P_acc(u) + host share

**Host share** (CPU, memory, fans and power conversion of the server): the node's
CPU pool — every greenfed agent reports its host CPU as a ``cpu`` accelerator
with its own power profile — at the same utilisation, split over the pool's
accelerators in proportion to those used: ``P_cpu(u) · cpu_count · a / pool_count``.
A node that reports no CPU pool adds ``host_overhead_ratio`` (default 10 %) of the
accelerator power instead. Work that runs *on* the CPU pool has no separate host
share. Facility overhead (cooling, distribution) is ``pue`` (default 1.0: left
out, so that results compare the IT energy the scheduler controls).

**Training**: u = ``training_utilisation`` (default 0.8, a typical board-power
share of data-parallel training); a node's run time is ``duration_s /
relative_speed``, so

    kWh = workers · P_member · duration_s / relative_speed / 3.6e6 · pue

**Inference** (long-running): energy per hour at the expected load. A replica
serving λ requests/s that each take s = ``reference_ms_per_request /
relative_speed`` ms is busy u = λ·s/1000 of the time (at most 1); λ is the
deployment's ``requests_per_s`` split evenly over its replicas. Without a known
load, u = ``inference_utilisation`` (default 0.3).

**Power capping** (``power_capping.py``): a device held to a power limit draws at
most that limit, ``min(P(u), limit)``, while its work runs slower
(``shared.accelerators.capped_throughput``); the host share is unchanged, so a
capped run also pays the host for its longer run time.

**Measured energy**: where telemetry gives energy per allocation (NVML energy
counters, RAPL), accounting uses it instead of this model (``accounting.Usage``).

Everything is vectorised over candidate nodes: the arrays are the snapshot's
node columns, indexed by node position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cloud.scheduler import Candidates, InferenceDeployment, Snapshot, TrainingJob, Work
from cloud.scheduler.arrays import FloatArray, IntArray
from shared.messages import AcceleratorKind

J_PER_KWH = 3.6e6
S_PER_H = 3600.0


def linear_power_w(
    idle_power_w: FloatArray | float,
    max_power_w: FloatArray | float,
    utilisation: FloatArray | float,
) -> FloatArray:
    """Power of one device at ``utilisation`` (0..1), linear between idle and max."""
    result: FloatArray = np.asarray(
        idle_power_w + (np.asarray(max_power_w) - idle_power_w) * utilisation, dtype=np.float64
    )
    return result


@dataclass(frozen=True, slots=True, kw_only=True)
class EnergyModel:
    training_utilisation: float = 0.8
    inference_utilisation: float = 0.3  # when a deployment's load is unknown
    host_overhead_ratio: float = 0.1  # for nodes that report no CPU pool
    pue: float = 1.0

    def __post_init__(self) -> None:
        for name in ("training_utilisation", "inference_utilisation"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within 0..1")
        if not self.host_overhead_ratio >= 0:
            raise ValueError("host_overhead_ratio must be >= 0")
        if not self.pue >= 1.0:
            raise ValueError("pue must be >= 1")

    # -- power ------------------------------------------------------------------

    def member_power_w(
        self,
        snapshot: Snapshot,
        kind: AcceleratorKind,
        nodes: IntArray,
        accelerators: int | IntArray,
        utilisation: float | FloatArray,
        *,
        column: int | None = None,
        power_limit_w: float | FloatArray | None = None,
    ) -> FloatArray:
        """Power (W) of ``accelerators`` devices of ``kind`` on each node, host share
        and PUE included; from pool ``column`` (snapshot.py), default the kind's first.
        ``power_limit_w`` caps each device's draw (NaN or None: no cap)."""
        table = snapshot.nodes
        columns = table.kind(kind) if column is None else table.kinds[column]
        count = np.asarray(accelerators, dtype=np.float64)
        per_device_w = linear_power_w(
            columns.idle_power_w[nodes], columns.max_power_w[nodes], utilisation
        )
        if power_limit_w is not None:
            per_device_w = np.fmin(per_device_w, power_limit_w)  # fmin: NaN is no cap
        device_w = count * per_device_w
        if kind == "cpu":
            host_w = np.zeros_like(device_w)
        else:
            cpu = table.kind("cpu")
            cpu_count = cpu.capacity[nodes].astype(np.float64)
            # The host is shared by all the node's devices of the kind, in every pool.
            pool_count = np.maximum(table.kind_capacity(kind)[nodes], 1).astype(np.float64)
            measured_host_w = (
                cpu_count
                * linear_power_w(cpu.idle_power_w[nodes], cpu.max_power_w[nodes], utilisation)
                * count
                / pool_count
            )
            host_w = np.where(cpu_count > 0, measured_host_w, self.host_overhead_ratio * device_w)
        result: FloatArray = (device_w + host_w) * self.pue
        return result

    # -- training -----------------------------------------------------------------

    def training_kwh(
        self, snapshot: Snapshot, job: TrainingJob, candidates: Candidates
    ) -> FloatArray:
        """Energy (kWh) of the whole job if all its workers ran on each candidate."""
        power_w = self.member_power_w(
            snapshot,
            candidates.kind,
            candidates.nodes,
            job.accelerators_per_worker,
            self.training_utilisation,
            column=candidates.column,
        )
        result: FloatArray = job.workers * power_w * candidates.runtime_s / J_PER_KWH
        return result

    # -- inference ----------------------------------------------------------------

    def replica_utilisation(
        self,
        snapshot: Snapshot,
        deployment: InferenceDeployment,
        kind: AcceleratorKind,
        nodes: IntArray,
        requests_per_s: float | None = None,
        *,
        column: int | None = None,
    ) -> FloatArray:
        """Busy share of one replica on each node at ``requests_per_s`` over all replicas
        (default: the deployment's expected rate)."""
        rate = deployment.requests_per_s if requests_per_s is None else requests_per_s
        if deployment.reference_ms_per_request is None or (requests_per_s is None and rate <= 0):
            return np.full(nodes.size, self.inference_utilisation)
        table = snapshot.nodes
        speed = (table.kind(kind) if column is None else table.kinds[column]).relative_speed[nodes]
        service_s = deployment.reference_ms_per_request / speed / 1000.0
        result: FloatArray = np.clip(rate / deployment.replicas * service_s, 0.0, 1.0)
        return result

    def inference_kw(
        self, snapshot: Snapshot, deployment: InferenceDeployment, candidates: Candidates
    ) -> FloatArray:
        """Power (kW) of one replica on each candidate at the deployment's expected load:
        its energy per hour in kWh."""
        column = candidates.column
        utilisation = self.replica_utilisation(
            snapshot, deployment, candidates.kind, candidates.nodes, column=column
        )
        power_w = self.member_power_w(
            snapshot,
            candidates.kind,
            candidates.nodes,
            candidates.accelerators,
            utilisation,
            column=column,
        )
        result: FloatArray = power_w / 1000.0
        return result

    def work_kwh(
        self, snapshot: Snapshot, work: Work, candidates: Candidates, inference_window_s: float
    ) -> FloatArray:
        """Energy per candidate: a training job's whole run, or ``inference_window_s`` of
        all a deployment's replicas."""
        if isinstance(work, TrainingJob):
            return self.training_kwh(snapshot, work, candidates)
        result: FloatArray = (
            self.inference_kw(snapshot, work, candidates)
            * work.replicas
            * inference_window_s
            / S_PER_H
        )
        return result
