"""A store behind its fleet: nodes that applied a later `desired` generation than the
store holds for them.

Generations only grow, and an agent ignores a document of its cluster older than the
one it applied (edge/agent/desired.py). A store restored from a backup (or recovered
to a point in time) is the same cluster, since it keeps the cluster id, but its
generations are the backup's, while the agents went on applying what the lost control
plane published after it. Left so, a node would ignore every document of the restored
control plane: it would keep running what was placed there after the backup, unseen,
and never start what the restored one places.

So each pass raises the generation of every node whose agent reports having applied
more than the store holds to one past it (`Store.raise_generations`); the pass then
publishes those nodes' documents and their agents apply them: work the store knows
there goes on (the same job and attempt is the same worker), the rest stops. In normal
running a node never reports more than the store holds (every generation it sees was
the store's first), so this does nothing.

A store that is not the fleet's at all (a control plane started on an empty database,
a new cluster id; its nodes re-admitted, cloud/api/readmission.py) holds no generation
for nodes whose agents still run the lost cluster's work. Each pass gives every node
that reports another cluster's document, and has no generation here, a first one
(`first_generations`): its document goes out, the agent adopts the new cluster's
document (edge/agent/desired.py) and stops the lost cluster's workers instead of
running them unseen.

A report is the node's own word, and only moves that node's own generation: a node
that claims too much gets documents with larger numbers, nothing else. A claim beyond
`MAX_PLAUSIBLE_GENERATION` is ignored, so that no node can push its counter near the
column's limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from cloud.fleet.registry import NodeRecord

# Far beyond what years of passes reach, far below a BIGINT's 2**63.
MAX_PLAUSIBLE_GENERATION: Final = 2**53


def generations_behind(
    nodes: Mapping[str, NodeRecord], stored: Mapping[str, int]
) -> dict[str, int]:
    """Node -> the generation the store must raise it to: one past what the node reports
    having applied, for each node that applied more than the store holds. `nodes` are
    the reports of this cluster only (`of_this_cluster`)."""
    floors: dict[str, int] = {}
    for node_id, record in nodes.items():
        if record.reported is None:
            continue
        observed = record.reported.observed_generation
        if stored.get(node_id, 0) < observed <= MAX_PLAUSIBLE_GENERATION:
            floors[node_id] = observed + 1
    return floors


def first_generations(
    nodes: Mapping[str, NodeRecord], stored: Mapping[str, int], cluster_id: str
) -> dict[str, int]:
    """Node -> 1 for each node that reports another cluster's document and has no
    generation in the store. `nodes`: the registry's, reports of every cluster."""
    return {
        node_id: 1
        for node_id, record in nodes.items()
        if record.reported is not None
        and record.reported.cluster_id not in (None, cluster_id)
        and stored.get(node_id, 0) == 0
    }
