"""How many replicas an autoscaled deployment should have (the Kubernetes HPA's rule).

From the serving figures its nodes send in telemetry (`DeploymentSample`), per
decision:

1. the observed value per ready replica (requests per second, or the worst p95
   latency) against the target gives a recommendation, ``ceil(ready × observed /
   target)``; within ``tolerance`` of the target it is the current desired count;
2. the carbon ladder (``max_replicas_by_carbon``, as Azure's carbon-aware KEDA
   operator): at or above a threshold of the grid intensity where the replicas run,
   the recommendation is at most its cap, never below ``min_replicas``, and not capped
   while the p95 latency breaks the deployment's ``latency_slo_ms``;
3. stabilisation, as the HPA does it: scaling up takes the *lowest* recommendation of
   the last ``scale_up_stabilization_s`` (0: the newest), scaling down the *highest*
   of the last ``scale_down_stabilization_s``, and only once recommendations have been
   seen for that long (a new leader does not scale down on its first look);
4. at most ``max_step`` replicas per decision, within ``min_replicas..max_replicas``.

The cap is part of the recommendation, not a last word on the decision: a dirty grid
scales a deployment down as a fall in load does, a step at a time and after the window
(applied last, it took ten replicas to two at once, on a new leader's first look too).
While a breach of the SLO lifts the cap, its uncapped recommendation stays in the
scale-down window: the replicas it added stay for the window, instead of going at the
next pass that meets the SLO (which flapped them every pass).

Idle under a latency target (no request since the last samples, so no p95 to
measure): the recommendation is ``min_replicas``, as a request rate of 0 recommends
the fewest; the cap, the window and ``max_step`` then apply as ever. Without it a
deployment scaled up for a burst kept every replica, on a dirty grid too, until
traffic came back. A p95 missing while requests are served says nothing: no decision.

No figures (no replica reports serving yet): no decision. An absurd figure never
raises (the pass's scheduler runs after this): a recommendation past
`RECOMMENDATION_CEILING`, or infinite (nodes' figures added up past the largest
float), counts as the ceiling, and step 4 takes the deployment towards
``max_replicas``, ``max_step`` at a time, as for a real surge. Ignoring it instead
would leave a deployment that is truly swamped unscaled on a guess that its figures
are wrong, and telemetry already refuses figures no node could measure
(shared/messages.py). The history lives in the leader's memory, as the HPA's lives in
its controller.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from cloud.work.specs import AutoscaleSpec

# Replicas: a recommendation above it says no more than "far beyond max_replicas"
# (at most 4096), and an exact one would be a number of hundreds of digits in the
# `work.scaled` event.
RECOMMENDATION_CEILING = 1_000_000


@dataclass(frozen=True, slots=True)
class ServingLoad:
    ready_replicas: int  # replicas reported ready on online nodes that send serving figures
    requests_per_s: float  # over all of them
    p95_latency_ms: float | None  # the worst replica's


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    work_id: str
    from_replicas: int
    to_replicas: int
    metric: str  # requests_per_s | p95_latency_ms
    observed: float  # per ready replica
    target: float
    recommendation: int
    carbon_cap: int | None
    reason: str


@dataclass(slots=True)
class _History:
    first_seen_s: float
    recommendations: deque[tuple[float, int]]


def _observed(spec: AutoscaleSpec, load: ServingLoad) -> tuple[str, float, float] | None:
    if spec.target_requests_per_s is not None:
        per_replica = load.requests_per_s / load.ready_replicas
        return "requests_per_s", per_replica, spec.target_requests_per_s
    if load.p95_latency_ms is None or spec.target_p95_latency_ms is None:
        return None
    return "p95_latency_ms", load.p95_latency_ms, spec.target_p95_latency_ms


def _recommendation(
    spec: AutoscaleSpec, desired: int, load: ServingLoad
) -> tuple[str, float, float, int] | None:
    """(metric, observed value per ready replica, target, recommended replicas); None:
    nothing measured to decide on."""
    if _idle_on_latency(spec, load):
        assert spec.target_p95_latency_ms is not None
        return "p95_latency_ms", 0.0, spec.target_p95_latency_ms, spec.min_replicas
    observed = _observed(spec, load)
    if observed is None:
        return None
    metric, value, target = observed
    ratio = value / target
    if math.isnan(ratio):
        return None  # not a measurement (telemetry never decodes to one)
    if abs(ratio - 1.0) <= spec.tolerance:
        return metric, value, target, desired
    wanted_replicas = load.ready_replicas * ratio  # inf where it overflowed
    # math.ceil(inf) raises, and one deployment's figures must not stop the pass (the
    # deployment step runs before the scheduler): a figure that no replica count meets
    # asks for the most, as a surge does.
    if wanted_replicas >= RECOMMENDATION_CEILING:
        return metric, value, target, RECOMMENDATION_CEILING
    return metric, value, target, math.ceil(wanted_replicas)


def _idle_on_latency(spec: AutoscaleSpec, load: ServingLoad) -> bool:
    """Scaled on latency, and no replica answered a request since its last sample: an
    idle replica measures no p95 (edge/inference/stats.py)."""
    return (
        spec.target_p95_latency_ms is not None
        and load.p95_latency_ms is None
        and load.requests_per_s == 0.0
    )


def carbon_cap(spec: AutoscaleSpec, intensity_g_per_kwh: float | None) -> int | None:
    """The ladder's cap at this intensity (None: no step applies)."""
    if intensity_g_per_kwh is None:
        return None
    caps = [
        step.max_replicas
        for step in spec.max_replicas_by_carbon
        if intensity_g_per_kwh >= step.above_g_per_kwh
    ]
    return max(min(caps), spec.min_replicas) if caps else None


class Autoscaler:
    def __init__(self) -> None:
        self._history: dict[str, _History] = {}

    def forget(self, active: Iterable[str]) -> None:
        """Drop the history of deployments no longer autoscaled."""
        keep = set(active)
        for work_id in set(self._history) - keep:
            del self._history[work_id]

    def reset(self) -> None:
        self._history.clear()

    def decide(
        self,
        work_id: str,
        spec: AutoscaleSpec,
        desired: int,
        load: ServingLoad | None,
        *,
        now_s: float,
        intensity_g_per_kwh: float | None = None,
        latency_slo_ms: float | None = None,
    ) -> ScaleDecision | None:
        """A change of `desired` (the spec's replicas now), or None."""
        if load is None or load.ready_replicas == 0:
            return None
        recommended = _recommendation(spec, desired, load)
        if recommended is None:
            return None
        metric, value, target, recommendation = recommended
        breaching = (
            latency_slo_ms is not None
            and load.p95_latency_ms is not None
            and load.p95_latency_ms > latency_slo_ms
        )
        cap = None if breaching else carbon_cap(spec, intensity_g_per_kwh)
        capped = recommendation if cap is None else min(recommendation, cap)
        history = self._history.get(work_id)
        if history is None:
            history = self._history[work_id] = _History(now_s, deque())
        history.recommendations.append((now_s, capped))
        horizon_s = max(spec.scale_up_stabilization_s, spec.scale_down_stabilization_s)
        while history.recommendations and now_s - history.recommendations[0][0] > horizon_s:
            history.recommendations.popleft()

        def within(window_s: float) -> list[int]:
            return [r for t, r in history.recommendations if now_s - t <= window_s]

        wanted = desired
        if capped > desired:
            wanted = max(desired, min(within(spec.scale_up_stabilization_s)))
        elif capped < desired and now_s - history.first_seen_s >= spec.scale_down_stabilization_s:
            wanted = min(desired, max(within(spec.scale_down_stabilization_s)))
        wanted = max(desired - spec.max_step, min(desired + spec.max_step, wanted))
        wanted = max(spec.min_replicas, min(spec.max_replicas, wanted))
        if wanted == desired:
            return None
        if _idle_on_latency(spec, load):
            reason = (
                f"no requests, so no p95 against a target of {target:.3g} ms: "
                f"{recommendation} (min_replicas) recommended"
            )
        else:
            unit = "requests/s" if metric == "requests_per_s" else "ms p95"
            reason = (
                f"{value:.3g} {unit} per replica against a target of {target:.3g}: "
                f"{recommendation} recommended"
            )
        if cap is not None and cap < recommendation:
            reason += f", capped at {cap} while the grid is at {intensity_g_per_kwh:.0f} gCO2/kWh"
        return ScaleDecision(
            work_id=work_id,
            from_replicas=desired,
            to_replicas=wanted,
            metric=metric,
            observed=value,
            target=target,
            recommendation=recommendation,
            carbon_cap=cap,
            reason=reason,
        )
