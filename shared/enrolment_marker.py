"""The first line `greenfed edge enrol` writes into the agent's settings file, which
records the enrolment (API URL, cluster id, node id): it makes enrolling again a no-op
and tells `greenfed edge doctor` which control plane to compare the clock with."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

MARKER_PREFIX: Final = "# greenfed enrolment:"
_MARKER: Final = re.compile(
    r"^# greenfed enrolment: api=(?P<api>\S+) cluster_id=(?P<cluster>\S+) node_id=(?P<node>\S+)$"
)


@dataclass(frozen=True, slots=True)
class EnrolmentMarker:
    api: str
    cluster_id: str
    node_id: str

    def line(self) -> str:
        return f"{MARKER_PREFIX} api={self.api} cluster_id={self.cluster_id} node_id={self.node_id}"


def read_marker(text: str) -> EnrolmentMarker | None:
    first = text.split("\n", 1)[0]
    match = _MARKER.match(first)
    if match is None:
        return None
    return EnrolmentMarker(match.group("api"), match.group("cluster"), match.group("node"))
