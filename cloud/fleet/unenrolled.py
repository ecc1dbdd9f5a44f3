"""Nodes knocking without an enrolment: births refused as `not_enrolled` that prove the
identity this control plane once certified (cloud/fleet/certificates.py), kept so that
an admin can re-admit them in bulk after the store was lost without a backup
(`POST /v1/nodes/readmit`, docs/operations.md).

Only births are kept, and only proven ones: anyone can publish a birth on an open
broker, but only the holder of a node's sealing key can prove the certificate it shows.
Each replica keeps its own table from the births it ingests (every replica ingests every
birth), bounded; the oldest-seen entry makes room. The raw birth is kept too, and the
node's latest `reported` document: once the node is admitted both are ingested again,
so the node is online at once instead of at its next birth, and what it runs (the lost
cluster's work, which the scheduling loop then stops: cloud/loop/generations.py) is
known at once instead of at its next change.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

import structlog

from cloud.fleet.certificates import CertificateAuthority, NodeCertificate
from shared.enrolment_certificate import CertificateError
from shared.logs import RateLimitedLog
from shared.messages import NodeStatus

MAX_KNOCKING_NODES: Final = 10_000

_log = structlog.get_logger("greenfed.enrolment")


@dataclass(frozen=True, slots=True)
class KnockingNode:
    certificate: NodeCertificate
    status: NodeStatus
    payload: bytes  # the birth as it came, to ingest once the node is admitted
    first_seen_s: float
    last_seen_s: float
    report: bytes | None = None  # its latest `reported` document, likewise


class UnenrolledNodes:
    def __init__(
        self,
        clock: Callable[[], float],
        *,
        capacity: int = MAX_KNOCKING_NODES,
        log_interval_s: float = 10.0,
    ) -> None:
        self._clock = clock
        self._capacity = capacity
        self._nodes: OrderedDict[str, KnockingNode] = OrderedDict()
        # Set once the signing key is loaded (cloud/api/enrolment.py); until then no
        # birth can be judged, and none is kept.
        self.authority: CertificateAuthority | None = None
        self.unproven = 0  # births that showed a certificate which did not hold
        self._refused_log = RateLimitedLog(_log, log_interval_s)

    def offer(self, status: NodeStatus, payload: bytes) -> None:
        """A birth of a node id that is not enrolled: kept if it proves its certificate."""
        if status.enrolment_certificate is None or self.authority is None:
            return
        now_s = self._clock()
        known = self._nodes.get(status.node_id)
        if known is not None and known.payload == payload:  # the same birth again
            self._nodes[status.node_id] = _seen(known, now_s)
            self._nodes.move_to_end(status.node_id)
            return
        try:
            certificate = self.authority.judge_birth(status)
        except CertificateError as error:
            self.unproven += 1
            self._refused_log.warning(
                "unproven",
                "birth of a node not enrolled: its certificate does not hold",
                node_id=status.node_id,
                error=str(error),
            )
            return
        if known is not None and certificate.enrolled_at < known.certificate.enrolled_at:
            # An older enrolment of the id than the one its births showed before (a key
            # the node enrolled away from, e.g. a stolen device's): never what re-admits it.
            self.unproven += 1
            self._refused_log.warning(
                "superseded",
                "birth of a node not enrolled: its certificate is older than one seen before",
                node_id=status.node_id,
            )
            return
        first_seen_s = now_s if known is None else known.first_seen_s
        self._nodes[status.node_id] = KnockingNode(
            certificate,
            status,
            bytes(payload),
            first_seen_s,
            now_s,
            None if known is None else known.report,
        )
        self._nodes.move_to_end(status.node_id)
        while len(self._nodes) > self._capacity:
            self._nodes.popitem(last=False)

    def note_report(self, node_id: str, payload: bytes) -> None:
        """A `reported` document of a node id that is not enrolled: kept (undecoded; it
        is judged as it is ingested) for a knocking node only."""
        known = self._nodes.get(node_id)
        if known is not None:
            self._nodes[node_id] = dataclasses.replace(known, report=bytes(payload))

    def listing(self) -> tuple[KnockingNode, ...]:
        """Every knocking node, by node id."""
        return tuple(self._nodes[node_id] for node_id in sorted(self._nodes))

    def get(self, node_id: str) -> KnockingNode | None:
        return self._nodes.get(node_id)

    def admitted(self, node_ids: Iterable[str]) -> list[KnockingNode]:
        """Forget the nodes that are admitted now; what each last sent, to ingest."""
        found = []
        for node_id in node_ids:
            knocking = self._nodes.pop(node_id, None)
            if knocking is not None:
                found.append(knocking)
        return found


def _seen(node: KnockingNode, now_s: float) -> KnockingNode:
    return dataclasses.replace(node, last_seen_s=now_s)
