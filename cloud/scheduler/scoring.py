"""The built-in score terms, each normalised to 0..1 where 1 is best.

* packing: fill partly used nodes first. The score is the share of the node's
  accelerators still free *after* the placement, inverted: a 1-GPU job scores
  7/8 on an 8-GPU node with 2 free but only 1/8 on an empty one, so free 8-GPU
  nodes stay whole for the jobs that need them. A policy with a ``CapacityValue``
  (green) blends in *shape fit* (``ShapeFit``): how many of the node's free
  accelerators the placement leaves unusable to the members the cluster runs and
  queues, weighed by what the node's capacity is worth (its cleanliness), so a 4-GPU
  member goes to a clean 4-GPU node rather than break a clean 8-GPU one.
* load: 1 while the node's utilisation (measured, plus what this pass added) is
  at or under the policy threshold (default 60%), then falling linearly to 0 at 100%.
* speed: the node's relative speed over the fastest pool of that kind; the
  estimated runtime scales with its inverse.
* preference: the deployment's order of accepted kinds, then of ONNX providers.
* spread: replicas go to the regions that have fewest of them relative to the
  deployment's traffic from that region.

The total is the weighted sum of all terms, extra ``ScoreTerm``s included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from .arrays import FloatArray, IntArray, read_only

_Score = TypeVar("_Score", float, FloatArray)


def packing_and_load(
    free: IntArray,
    accelerators: int,
    inv_capacity: FloatArray,
    base_utilisation: FloatArray,
    utilisation_delta: IntArray,
    threshold: float,
) -> tuple[FloatArray, FloatArray]:
    """The placement-dependent terms, unweighted, for one member on many nodes.

    ``free`` is before the placement; ``base_utilisation`` is the measured share
    and ``utilisation_delta`` the accelerators this pass added (+) or released (-).
    ``packing_and_load_one`` is the same formula for one node, operation for
    operation, so both give the same bits: the scores placement uses, the scores
    re-computed node by node and the breakdown an explanation shows never disagree.
    """
    packing: FloatArray = 1.0 - (free - accelerators) * inv_capacity
    utilisation = base_utilisation + utilisation_delta * inv_capacity
    load: FloatArray = np.clip((1.0 - utilisation) / (1.0 - threshold), 0.0, 1.0)
    return packing, load


def packing_and_load_one(
    free: int,
    accelerators: int,
    inv_capacity: float,
    base_utilisation: float,
    utilisation_delta: int,
    threshold: float,
) -> tuple[float, float]:
    """``packing_and_load`` for one node, with Python floats (cheap one-node updates)."""
    packing = 1.0 - (free - accelerators) * inv_capacity
    load = (1.0 - (base_utilisation + utilisation_delta * inv_capacity)) / (1.0 - threshold)
    return packing, 0.0 if load < 0.0 else 1.0 if load > 1.0 else load


@dataclass(frozen=True, slots=True)
class ShapeFit:
    """Fragmentation in the spirit of FGD (Weng et al., ATC '23), over one pool column.

    ``unusable[f]``: of ``f`` free accelerators on a node, how many the expected
    members cannot use, Σ_g p_g · (f mod g) over member sizes g with demand share
    p_g (a member larger than f leaves all f unusable). ``value``: per node, 0..1,
    what its capacity is worth to the rest of the queue (1: the cleanest; 0: nobody
    minds where it fragments). A placement of ``a`` on a node with ``f`` free
    changes the unusable count by ``unusable[f − a] − unusable[f]``; the fit score
    is 0.5 minus that change × value over twice the node's capacity, clipped to
    0..1 (0.5: neither helps nor harms; above: it uses up an awkward remainder).
    """

    unusable: FloatArray  # by free accelerator count, 0..the column's largest capacity
    value: FloatArray  # per node row

    @staticmethod
    def for_demand(demand: Mapping[int, float], largest: int, value: FloatArray) -> ShapeFit:
        """From the accelerators wanted per member size (any unit: shares are taken)."""
        free = np.arange(largest + 1, dtype=np.float64)
        unusable = np.zeros(largest + 1)
        total = sum(weight for size, weight in demand.items() if size > 0 and weight > 0)
        for size, weight in demand.items():
            if size > 0 and weight > 0 and total > 0:
                unusable += (weight / total) * np.mod(free, size)
        return ShapeFit(read_only(unusable), read_only(value))


def shape_fit(
    fit: ShapeFit,
    free: IntArray,
    accelerators: int,
    inv_capacity: FloatArray,
    where: slice | IntArray,
) -> FloatArray:
    """The fit score of one member on many nodes (``where``: their rows); where the
    member does not fit, any value (the caller masks those). A node running more than
    its healthy devices (some failed under work) has less than nothing free: it reads
    as full, never as an index from the table's end."""
    before = np.maximum(free, 0)
    after = np.maximum(free - accelerators, 0)
    change = fit.unusable[after] - fit.unusable[before]
    result: FloatArray = np.clip(0.5 - 0.5 * change * fit.value[where] * inv_capacity, 0.0, 1.0)
    return result


def shape_fit_one(
    fit: ShapeFit, free: int, accelerators: int, inv_capacity: float, node: int
) -> float:
    """``shape_fit`` for one node, with Python floats: the same bits."""
    after = free - accelerators if free > accelerators else 0
    change = fit.unusable.item(after) - fit.unusable.item(free if free > 0 else 0)
    value = 0.5 - 0.5 * change * fit.value.item(node) * inv_capacity
    return 0.0 if value < 0.0 else 1.0 if value > 1.0 else value


def blend_fit(packing: _Score, fit: _Score) -> _Score:
    """Packing with shape fit blended in: both count half (``ShapeFit``); for one node
    (floats) or many (arrays), the same operations, so the same bits."""
    blended: _Score = 0.5 * packing + 0.5 * fit
    return blended


def speed(relative_speed: FloatArray, max_speed: float) -> FloatArray:
    result: FloatArray = relative_speed / max_speed
    return result


def preference(
    kind_rank: int, kind_count: int, provider_rank: IntArray, provider_count: int
) -> FloatArray:
    """Kind order dominates; provider order refines within a kind."""
    step = 1.0 / kind_count
    penalty = provider_rank.astype(np.float64) * (step / max(provider_count, 1))
    result: FloatArray = (1.0 - kind_rank * step) - penalty
    return result


def traffic_weights(regions: Sequence[str], traffic: Mapping[str, float]) -> FloatArray:
    """Per region code: the deployment's traffic share (plus a little, so regions without
    traffic still beat doubling up), or 1 everywhere without traffic data."""
    total = sum(traffic.values())
    if total <= 0:
        return np.ones(len(regions))
    return np.array([traffic.get(region, 0.0) / total + 0.05 for region in regions])


def spread_by_region(weights: FloatArray, replicas: IntArray) -> FloatArray:
    """Per region code: traffic weight over 1 + replicas already there, scaled to max 1."""
    desire = weights / (1.0 + replicas)
    peak = float(np.maximum.reduce(desire)) if desire.size else 0.0
    result: FloatArray = desire / peak if peak > 0 else desire
    return result
