"""What a node's outage most likely is: where the control plane tells a node that
crashed from one that is cut off (and may be working on alone), as far as it can.

While a node is offline, from how its connection ended:

- **stopped**: it said goodbye (`shutdown`);
- **crashed**: the broker published its will while it was still talking (within
  `ABRUPT_INTERVALS` of its telemetry interval of its last message): its connection
  was closed, which is what the operating system does when the agent or its host
  goes down;
- **partitioned**: it went silent (the will came only after the broker's keep-alive
  ran out, or its telemetry stopped): the node or its link is unreachable, and its
  agent may be running alone (edge agents keep serving and training from disk).

A host that loses power looks partitioned until it comes back: that is the "as far as
it can". When the node is back, its birth settles it: the same agent instance means
it was partitioned and kept running; a new one means its agent restarted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shared.messages import OfflineReason

OutageCause = Literal["stopped", "crashed", "partitioned"]
OutageEnd = Literal["partition", "restart"]

# A will within this many telemetry intervals of the last message: the link was closed.
ABRUPT_INTERVALS = 2.0


def offline_cause(
    reason: OfflineReason, silent_for_s: float, telemetry_interval_s: float
) -> OutageCause:
    """The likely cause of going offline for `reason`, `silent_for_s` after the node's
    last message."""
    if reason == "shutdown":
        return "stopped"
    if reason == "connection-lost" and silent_for_s <= ABRUPT_INTERVALS * telemetry_interval_s:
        return "crashed"
    return "partitioned"


@dataclass(frozen=True, slots=True)
class Outage:
    """The node's latest outage, once it ended."""

    cause: OutageCause  # as judged while it lasted
    ended_by: OutageEnd  # "partition": the same agent came back; "restart": a new one
    offline_s: float
    ended_at: float  # UTC epoch seconds


def ended_by(old_instance_id: str, new_instance_id: str) -> OutageEnd:
    return "partition" if old_instance_id == new_instance_id else "restart"
