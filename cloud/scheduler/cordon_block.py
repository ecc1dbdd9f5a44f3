"""Work kept off only by cordoned or draining nodes: it waits for them, it is not
unschedulable.

An admin's cordon (or drain) is the taint `greenfed.io/unschedulable`, which no work
tolerates, so work that only such nodes could run is rejected by the taint filter
everywhere it could go. Worded as "No node can run it" that sounds permanent; the
cordon ends when the admin uncordons. The core gives such work the pending code
`cordoned` and the sentence "Waiting for 2 cordoned or draining nodes: ...".
"""

from __future__ import annotations

import numpy as np

from shared.taints import CORDON_TAINT_KEY

from .arrays import CodeArray
from .filters import CODE
from .shape import WorkShape
from .snapshot import NodeTable


def cordoned_blockers(nodes: NodeTable, shape: WorkShape, furthest: CodeArray) -> int:
    """Nodes that would pass every filter up to the taint filter, held off by the
    cordon taint and no other it does not tolerate (`furthest`: per node, the code of
    the filter it was rejected by, over all the work's kinds)."""
    cordon = [i for i, taint in enumerate(nodes.taints) if taint.key == CORDON_TAINT_KEY]
    if not cordon:
        return 0
    at_taint = (furthest == CODE["taint"]) & nodes.taint_matrix[:, cordon].any(axis=1)
    if not at_taint.any():
        return 0
    tolerations = shape.work.tolerations
    others = [
        i
        for i, taint in enumerate(nodes.taints)
        if taint.key != CORDON_TAINT_KEY
        and taint.effect == "NoSchedule"
        and not any(t.tolerates(taint) for t in tolerations)
    ]
    if others:
        at_taint &= ~nodes.taint_matrix[:, others].any(axis=1)
    return int(np.count_nonzero(at_taint))


def waiting_for_cordoned(count: int, summary: str) -> str:
    """E.g. ``Waiting for 2 cordoned or draining nodes: no other node can run it; 0/5
    nodes fit: 3 no GPU, 2 untolerated taint.``"""
    nodes = "node" if count == 1 else "nodes"
    return (
        f"Waiting for {count} cordoned or draining {nodes}: no other node can run it "
        f"(an admin's uncordon lets it run there); {summary}."
    )
