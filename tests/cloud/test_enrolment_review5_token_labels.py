"""A join token's labels, held by the node's envelope (no I/O): laid over the agent's
labels (an admin's and the well-known ones over them), never judged for approval, and
an envelope stored before they were kept still reads."""

from __future__ import annotations

import msgspec

from cloud.fleet.envelope import ENVELOPE_DECODER, NodeEnvelope, judge
from cloud.fleet.well_known_labels import node_labels
from tests.cloud.test_well_known_labels import status


def test_the_tokens_labels_win_over_the_agents_and_the_agent_may_add_others() -> None:
    labels = node_labels(
        status({"pool": "trusted", "compliance": "pci"}), None, {"pool": "quarantine"}
    )
    assert (labels["pool"], labels["compliance"]) == ("quarantine", "pci")
    assert node_labels(status({}), None, {"pool": "quarantine"})["pool"] == "quarantine"


def test_an_admin_label_wins_over_the_tokens_and_the_well_known_ones_over_all() -> None:
    labels = node_labels(
        status({}), {"pool": "cleared"}, {"pool": "quarantine", "zone": "elsewhere"}
    )
    assert (labels["pool"], labels["zone"]) == ("cleared", "DE")


def test_an_envelope_stored_before_labels_were_kept_reads_and_writes_as_before() -> None:
    stored = b'{"site":"edge","work":"inference","max_accelerators":{"gpu":1}}'
    envelope = ENVELOPE_DECODER.decode(stored)
    assert envelope.labels == {}
    assert msgspec.json.encode(envelope) == stored


def test_labels_never_put_a_node_in_pending_approval() -> None:
    envelope = NodeEnvelope(site="cloud", labels={"pool": "quarantine"})
    assert judge(status({"pool": "trusted"}), envelope, None) == ()
