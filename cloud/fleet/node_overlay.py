"""What an admin set on nodes, laid over what their agents declare (no I/O: node views
and the scheduler's nodes both read it).

A cordoned node takes no new work: it carries the taint `greenfed.io/unschedulable`,
which no work may tolerate (cloud/work/specs.py refuses the key), so its running work
stays and the scheduler's explanations name it like any other taint. Taints and labels
an admin sets are added to the agent's (an admin label wins over the agent's of the
same key); every node also carries the well-known labels (site, zone, region,
hostname; rack and block where set), cloud/fleet/well_known_labels.py.
cloud/fleet/node_admin.py keeps them fresh on every replica.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cloud.fleet.well_known_labels import node_labels
from shared.messages import NodeTaint
from shared.taints import CORDON_TAINT_KEY, parse_taint

if TYPE_CHECKING:
    from cloud.fleet.registry import NodeRecord
    from cloud.store import NodeAdminRecord

CORDON_TAINT = NodeTaint(key=CORDON_TAINT_KEY, value="", effect="NoSchedule")


def admin_taints(record: NodeAdminRecord | None) -> tuple[NodeTaint, ...]:
    if record is None:
        return ()
    taints = [NodeTaint(key=k, value=v, effect=e) for k, v, e in map(parse_taint, record.taints)]
    if record.cordoned:
        taints.append(CORDON_TAINT)
    return tuple(taints)


def effective_taints(record: NodeRecord) -> tuple[NodeTaint, ...]:
    """The agent's taints, then the admin's (cordon included), without repeats."""
    return tuple(dict.fromkeys((*record.status.taints, *admin_taints(record.admin))))


def effective_labels(record: NodeRecord) -> dict[str, str]:
    """The agent's labels, its join token's over them, the admin's over those, and the
    well-known ones over all (cloud/fleet/well_known_labels.py)."""
    admin_labels = None if record.admin is None else record.admin.labels
    return node_labels(record.status, admin_labels, record.enrolled_labels)


def taint_text(taint: NodeTaint) -> str:
    text = f"{taint.key}={taint.value}" if taint.value else taint.key
    return f"{text}:{taint.effect}"
