"""Each policy's share of the offline optimum's CO2 saving: for training, for inference
and in total.

Two bounds, each a relaxation that no evaluated policy can beat: training's
(bound.py: the least training CO2 over the policies' service) and inference's
(inference_bound.py: the least inference CO2 over the same deployments' service). So:

* training: (baseline's training − policy's training) / (baseline's training − the
  training bound).
* inference: the same with inference emissions and the inference bound.
* total (training + inference, what the headline cut covers): against the sum of the
  two bounds. Each bound is below every policy's own figure, so their sum is below
  every policy's total.

No policy exceeds 100 % of any of them. A share is None where the baseline leaves no
room to save (it already emits what the bound does), and the training and total shares
are None where some policy left a job unfinished that the training bound does in full
(``Bound.unequal_work`` says which): that policy emitted for less work than the bound,
and its share, or any other measured over that baseline, would not compare.
"Baseline" is the first policy listed, as for "CO2 vs first".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .bound import Bound
from .inference_bound import InferenceBound
from .metrics import PolicyResult

# A baseline within this share of the bound leaves no room to save: a share of that
# would be noise over noise (the LP's tolerance is far below it).
_NO_ROOM = 1e-9


@dataclass(frozen=True, slots=True)
class OptimumShares:
    training: float | None  # None: the optimum saves nothing over the baseline, or
    # some policy did less of the work than it (Bound.unequal_work; so the total too)
    inference: float | None
    total: float | None


def total_reference_gco2(bound: Bound, inference_bound: InferenceBound) -> float:
    """The total the total share is measured against: both bounds together."""
    return bound.gco2 + inference_bound.gco2


def _share(baseline: float, policy: float, reference: float) -> float | None:
    possible = baseline - reference
    if possible <= _NO_ROOM * max(abs(baseline), 1.0):
        return None
    return (baseline - policy) / possible


def optimum_shares(
    results: Sequence[PolicyResult],
    result: PolicyResult,
    bound: Bound,
    inference_bound: InferenceBound,
) -> OptimumShares:
    """``result``'s shares of the optimum's saving over ``results[0]``."""
    baseline = results[0]
    inference = _share(baseline.inference_gco2, result.inference_gco2, inference_bound.gco2)
    if bound.unequal_work:
        return OptimumShares(training=None, inference=inference, total=None)
    return OptimumShares(
        training=_share(baseline.training_gco2, result.training_gco2, bound.gco2),
        inference=inference,
        total=_share(baseline.gco2, result.gco2, total_reference_gco2(bound, inference_bound)),
    )
