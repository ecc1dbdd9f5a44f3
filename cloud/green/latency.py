"""Where latency is estimated: the request latency of an inference replica on each
candidate node.

    latency_ms = Σ_r w_r · RTT(r, node region)  +  response_ms

* network: the deployment's ``traffic_by_region`` shares w_r (normalised to sum
  to 1) times the round-trip time from each origin region to the node's region.
  Traffic swings over the day, and not in step where its regions' clocks differ: a
  deployment with known ``daily_mixes`` (the shares at each hour of a day) is judged
  by the worst of them for each node (a replica far from one region passes an SLO
  only if it does at that region's busiest hour);
  from the shipped GCP region matrix with distance-based values for regions it
  lacks (data: ``cloud.signals.latency_matrix``); a pair with an unknown region
  costs ``default_rtt_ms``; no traffic data: no network term.
* compute: service time s = ``reference_ms_per_request`` (the deployment's, on
  the reference accelerator, relative speed 1.0) or ``compute_ms[kind]`` when the
  deployment does not give one, divided by the node's relative speed. With a known
  load λ = ``requests_per_s`` / replicas the response time is that of an M/M/1
  queue, s / (1 − ρ) with ρ = λ·s; a replica that cannot keep up (ρ ≥ 1) has an
  infinite latency and so fails any SLO.

``ServingLatency`` is the scheduler's ``LatencyEstimator`` (the SLO is a hard
filter), what the ``latency`` score term ranks by and what the simulator checks
SLOs with; ``default_latency_estimator`` builds it from the shipped matrix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from cloud.scheduler import Candidates, InferenceDeployment, Snapshot
from cloud.scheduler.arrays import FloatArray
from cloud.signals.latency_matrix import region_rtt_table
from shared.messages import AcceleratorKind

DEFAULT_COMPUTE_MS: Mapping[AcceleratorKind, float] = MappingProxyType(
    {"gpu": 5.0, "npu": 10.0, "cpu": 40.0}
)


@dataclass(frozen=True, slots=True)
class ServingLatency:
    """Traffic-weighted RTT plus compute (and queueing) time per candidate node.

    ``rtt_ms`` holds region pairs in either order; a missing pair costs
    ``default_rtt_ms`` (0 within a region).
    """

    rtt_ms: Mapping[tuple[str, str], float]
    default_rtt_ms: float = 100.0
    compute_ms: Mapping[AcceleratorKind, float] = field(default_factory=lambda: DEFAULT_COMPUTE_MS)
    # Work id -> its traffic shares at each hour of a day, where known: placement then
    # meets the SLO at the worst of them, not only at `traffic_by_region`.
    daily_mixes: Mapping[str, tuple[Mapping[str, float], ...]] = field(default_factory=dict)

    def network_ms(self, regions: tuple[str, ...], traffic: Mapping[str, float]) -> FloatArray:
        """Traffic-weighted RTT to each region (indexed like ``regions``)."""
        weights = {origin: w for origin, w in traffic.items() if w > 0}
        total = sum(weights.values())
        result = np.zeros(len(regions))
        if total <= 0:
            return result
        for code, region in enumerate(regions):
            result[code] = sum(
                weight / total * self.rtt(origin, region) for origin, weight in weights.items()
            )
        return result

    def worst_network_ms(
        self, regions: tuple[str, ...], deployment: InferenceDeployment
    ) -> FloatArray:
        """``network_ms`` at the deployment's worst hour of the day for each region."""
        mixes = self.daily_mixes.get(deployment.work_id)
        if not mixes:
            return self.network_ms(regions, deployment.traffic_by_region)
        result: FloatArray = np.max([self.network_ms(regions, mix) for mix in mixes], axis=0)
        return result

    def rtt(self, origin: str, region: str) -> float:
        found = self.rtt_ms.get((origin, region))
        if found is None:
            found = self.rtt_ms.get((region, origin))
        if found is None:
            return 0.0 if origin == region else self.default_rtt_ms
        return found

    def service_ms(self, deployment: InferenceDeployment, kind: AcceleratorKind) -> float:
        if deployment.reference_ms_per_request is not None:
            return deployment.reference_ms_per_request
        return self.compute_ms.get(kind, 0.0)

    def response_ms(
        self,
        deployment: InferenceDeployment,
        kind: AcceleratorKind,
        relative_speed: FloatArray,
        requests_per_s: float | None = None,
    ) -> FloatArray:
        """Compute (and queueing) time of one request per node."""
        service = self.service_ms(deployment, kind) / relative_speed
        rate = deployment.requests_per_s if requests_per_s is None else requests_per_s
        if rate <= 0:
            return service
        busy = rate / deployment.replicas * service / 1000.0
        with np.errstate(divide="ignore"):
            result: FloatArray = np.where(busy < 1.0, service / (1.0 - busy), np.inf)
        return result

    def estimate_ms(
        self, snapshot: Snapshot, deployment: InferenceDeployment, candidates: Candidates
    ) -> FloatArray:
        nodes = snapshot.nodes
        network = self.worst_network_ms(nodes.regions, deployment)
        speed = candidates.pools(snapshot).relative_speed[candidates.nodes]
        result: FloatArray = network[nodes.region_code[candidates.nodes]] + self.response_ms(
            deployment, candidates.kind, speed
        )
        return result


def default_latency_estimator(
    regions: Iterable[str] | None = None,
    *,
    default_rtt_ms: float = 100.0,
    daily_mixes: Mapping[str, tuple[Mapping[str, float], ...]] | None = None,
) -> ServingLatency:
    """Built from the shipped region matrix (and its distance-based values, e.g. for
    africa-south1). `regions` limits the table to those a fleet and its traffic use;
    pairs with a region the matrix does not know cost `default_rtt_ms`."""
    return ServingLatency(
        rtt_ms=region_rtt_table(regions),
        default_rtt_ms=default_rtt_ms,
        daily_mixes=dict(daily_mixes or {}),
    )
