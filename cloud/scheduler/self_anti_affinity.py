"""Work whose members must each run on a node of their own, and a fleet too small for it.

Work in a `group` that also names that group among its `anti_affinity_groups` keeps
its own members apart: a gang of 8 such workers needs 8 nodes that could each hold
one. No node joining the work changes that, so when the fleet has fewer such nodes
the work could never run here: unschedulable.py refuses it at submission (a 422 on
`$.anti_affinity_groups`) or gives the queued work the pending code `unschedulable`
naming it, never "waiting for capacity".
"""

from __future__ import annotations

import numpy as np

from .arrays import IntArray
from .model import TrainingJob, Work
from .plan import NeverFits


def keeps_members_apart(work: Work) -> bool:
    return work.group is not None and work.group in work.anti_affinity_groups


def apart_never_fits(work: Work, per_node: IntArray, wanted: int) -> NeverFits | None:
    """Why `wanted` members of `work` kept apart could never fit, `per_node` being how
    many members each node of the fleet could hold; None when they could."""
    if not keeps_members_apart(work):
        return None
    nodes = int(np.count_nonzero(per_node))
    if wanted <= nodes:
        return None
    noun = "workers" if isinstance(work, TrainingJob) else "replicas"
    return NeverFits(
        "anti_affinity_groups",
        f"its {wanted} {noun} must each run on a node of their own (group {work.group} is "
        f"among its anti_affinity_groups) and only {nodes} node(s) could hold one",
    )
