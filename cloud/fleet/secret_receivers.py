"""Which nodes a job's secrets may be sealed to: the one rule the scheduler seals by
(cloud/loop/nodes.py) and the node's view shows (cloud/fleet/views.py, `receives_secrets`).
Here, in the fleet's modules, so that the CLI's views load without the control loop."""

from __future__ import annotations

from typing import Final

from cloud.fleet.registry import NodeRecord
from cloud.scheduler.model import ISOLATION_RANK
from shared.messages import IsolationLevel
from shared.placement_names import CLUSTER_LABEL

# The least isolation a node keeps its workers at to be sealed a job's secrets: "user"
# runs each worker as a user of its own, so no other tenant's worker reads them.
SECRETS_MIN_ISOLATION: Final[IsolationLevel] = "user"


def receives_secrets(record: NodeRecord) -> bool:
    """Whether a job's secrets may be sealed to the node: it announces a usable key (as
    the boundary let it through, cloud/fleet/ingest.py), sits inside what it enrolled as,
    and keeps tenants apart. At isolation "none" every worker of every tenant runs as the
    agent's own user, who can read the other workers' /proc/<pid>/environ and the node's
    sealing key: one tenant's secrets there would be every tenant's (docs/isolation.md)."""
    status = record.status
    if status.sealing_public_key is None or record.awaiting_approval:
        return False
    if CLUSTER_LABEL in status.labels:
        # Only the bridge declares it: an agent's birth that does is refused at the
        # boundary (cloud/fleet/plausibility.py). A registered cluster's node says
        # "none" (every job runs under the account greenfed submits with), but it
        # announces a key only where an admin registered the cluster with
        # `accepts_secrets`, and the key is the control plane's: the bridge opens the
        # secrets, no agent does (docs/backends.md).
        return True
    # An agent older than schema 1.8 runs workers as its own user: "none".
    isolation = status.isolation or "none"
    return ISOLATION_RANK[isolation] >= ISOLATION_RANK[SECRETS_MIN_ISOLATION]
