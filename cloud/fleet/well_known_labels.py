"""The well-known labels every node carries, and who may set each (no I/O).

Selectors, affinity and a gang's ``topology`` name places by label, so every node
carries the same keys whatever its agent declares (as Kubernetes' ``topology.kubernetes.io/
zone`` and ``kubernetes.io/hostname``):

- ``site``, ``zone``, ``region``: from the node's birth, which enrolment keeps inside
  what the node enrolled as (cloud/fleet/envelope.py); ``hostname``: the node's id, its
  one unique name in greenfed. Nobody overrides these: a label of the same key that the
  agent declares is dropped, and an admin may not set one (the REST API refuses it,
  ``reserved_label_error``), so a node cannot lie its way into a zone by a label.
- ``rack``, ``block``: where the operator sets them, an admin label (``greenfed nodes set
  NODE --label rack=r1``) winning over the agent's (its settings file); absent otherwise.

Every other label is the agent's, with its join token's over them (what it enrolled
as, kept in its envelope: its births may add labels, never change or drop the token's)
and an admin's over both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from shared.messages import NodeStatus

# Derived from the birth; neither the agent nor an admin may set them.
DERIVED_LABEL_KEYS: Final = ("site", "zone", "region", "hostname")
# Set by the operator, where it has them (admin over agent).
OPERATOR_LABEL_KEYS: Final = ("rack", "block")
WELL_KNOWN_LABEL_KEYS: Final = (*DERIVED_LABEL_KEYS, *OPERATOR_LABEL_KEYS)


def derived_labels(status: NodeStatus) -> dict[str, str]:
    """The labels read from the birth; a zone or region the node left empty is absent
    (an empty label value would match ``In [""]`` and say nothing)."""
    labels = {"site": status.site, "hostname": status.node_id}
    if status.zone:
        labels["zone"] = status.zone
    if status.region:
        labels["region"] = status.region
    return labels


def node_labels(
    status: NodeStatus,
    admin_labels: Mapping[str, str] | None,
    enrolled_labels: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The node's labels as selectors see them: the agent's, then its join token's over
    them (`enrolled_labels`, what it enrolled as: its births may add labels, never change
    or drop these), then the admin's, then the derived well-known ones over all."""
    labels = dict(status.labels)
    if enrolled_labels:
        labels.update(enrolled_labels)
    if admin_labels:
        labels.update(admin_labels)
    labels.update(derived_labels(status))
    return labels


def reserved_label_error(key: str) -> str | None:
    """Why an admin may not set label ``key`` (None: it may)."""
    if key in DERIVED_LABEL_KEYS:
        return (
            f"label {key!r} is well-known and comes from the node's enrolment and birth; "
            "it cannot be set (rack and block can)"
        )
    return None
