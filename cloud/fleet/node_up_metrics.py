"""`greenfed_node_up`, one series per node, written again only when the fleet changes.

prometheus_client formats every sample of every family on every scrape (it sorts and
escapes each sample's labels and formats its value): for 10,000 nodes that was most of
the fleet registry's cost, to say what had not changed since the scrape before. What
this family shows (which nodes there are, whether each is online, its site, zone and
region) changes only with a birth, a state change or a node leaving, each of which
bumps `NodeRegistry.version`; so the text is kept by that version, and a node's label
text by the birth it was written from. The lines are prometheus_client's, byte for
byte: labels sorted by name, escaped as the text format wants, values `1.0` and `0.0`.
"""

from __future__ import annotations

from cloud.fleet.accelerator_metrics import label_text
from cloud.fleet.registry import NodeRegistry
from shared.messages import NodeStatus

NAME = "greenfed_node_up"
HELP = "1 while a node is online, 0 while it is offline"
# In prometheus_client's order: sorted by name.
LABELS = ("node", "region", "site", "zone")


class NodeUpSeries:
    """The family's text for the registry as it is now."""

    def __init__(self, registry: NodeRegistry) -> None:
        self._registry = registry
        self._version: int | None = None
        self._text = b""
        # node id -> (the birth its label text was written from, `name{labels} `)
        self._prefixes: dict[str, tuple[NodeStatus, str]] = {}

    def _prefix(self, status: NodeStatus) -> str:
        cached = self._prefixes.get(status.node_id)
        if cached is not None and cached[0] is status:
            return cached[1]
        values = (status.node_id, status.region, status.site, status.zone)
        prefix = f"{NAME}{label_text(LABELS, values)} "
        self._prefixes[status.node_id] = (status, prefix)
        return prefix

    def exposition(self) -> bytes:
        """`# HELP`, `# TYPE` and a line per node, sorted by node id."""
        version = self._registry.version
        if version == self._version:
            return self._text
        records = self._registry.nodes()
        lines = [f"# HELP {NAME} {HELP}\n# TYPE {NAME} gauge\n"]
        lines += [
            self._prefix(record.status) + ("1.0\n" if record.state == "online" else "0.0\n")
            for record in records
        ]
        if len(self._prefixes) > len(records):  # nodes gone: forget their labels
            known = {record.node_id for record in records}
            self._prefixes = {k: v for k, v in self._prefixes.items() if k in known}
        self._text = "".join(lines).encode()
        self._version = version
        return self._text
