"""Each policy's share of the offline optimum's CO2 saving, for training and in total.

The bound (bound.py) optimises training only: its inference is whatever the policies
ran. So the shares are computed against different references, and named for them:

* training: (baseline's training − policy's training) / (baseline's training − the
  bound). The bound is a relaxation, so no policy exceeds 100 %.
* total (training + inference, what the headline cut covers): against the bound's
  training plus the *least inference any evaluated policy emitted*. That inference
  figure is the best schedule seen, not a proven optimum (none is computed), so the
  total share is an upper estimate of the share of a true total optimum; no evaluated
  policy exceeds 100 % of it either.
* inference alone: no share is given, because no inference optimum exists to
  measure against (``of_optimum_inference`` is null in JSON).

"Baseline" is the first policy listed, as for "CO2 vs first".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .bound import Bound
from .metrics import PolicyResult


@dataclass(frozen=True, slots=True)
class OptimumShares:
    training: float | None  # None: the optimum saves nothing over the baseline
    total: float | None


def total_reference_gco2(results: Sequence[PolicyResult], bound: Bound) -> float:
    """The total the total share is measured against: the bound's training plus the
    least inference CO2 of the evaluated policies."""
    inference = min((result.inference_gco2 for result in results), default=0.0)
    return bound.gco2 + inference


def _share(baseline: float, policy: float, reference: float) -> float | None:
    possible = baseline - reference
    if possible <= 0:
        return None
    return (baseline - policy) / possible


def optimum_shares(
    results: Sequence[PolicyResult], result: PolicyResult, bound: Bound
) -> OptimumShares:
    """``result``'s shares of the optimum's saving over ``results[0]``."""
    baseline = results[0]
    return OptimumShares(
        training=_share(baseline.training_gco2, result.training_gco2, bound.gco2),
        total=_share(baseline.gco2, result.gco2, total_reference_gco2(results, bound)),
    )
