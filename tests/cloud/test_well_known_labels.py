"""Every node carries the well-known labels (site, zone, region, hostname; rack and
block where the operator sets them), and neither its agent nor an admin can make it
lie about where it is."""

from __future__ import annotations

from cloud.fleet.well_known_labels import node_labels, reserved_label_error
from shared.messages import HostInfo, NodeStatus

GIB = 1024**3


def status(labels: dict[str, str], *, zone: str = "DE", region: str = "europe-west3") -> NodeStatus:
    return NodeStatus(
        node_id="a100-0", state="online", instance_id="i1", agent_version="test", site="cloud",
        zone=zone, region=region, labels=labels,
        host=HostInfo(hostname="box", os="Linux", arch="x86_64", cpu_logical_cores=32,
                      memory_total_bytes=64 * GIB),
        accelerators=(), telemetry_interval_s=10.0, started_at=0.0, sent_at=0.0,
    )  # fmt: skip


def test_every_node_carries_site_zone_region_and_hostname_from_its_birth() -> None:
    labels = node_labels(status({"team": "vision"}), None)
    assert labels == {
        "team": "vision",
        "site": "cloud",
        "zone": "DE",
        "region": "europe-west3",
        "hostname": "a100-0",
    }


def test_an_agent_label_cannot_move_the_node_to_another_zone_or_region() -> None:
    labels = node_labels(status({"zone": "FR", "region": "us-west2", "hostname": "x"}), None)
    assert (labels["zone"], labels["region"], labels["hostname"]) == (
        "DE",
        "europe-west3",
        "a100-0",
    )


def test_the_operator_sets_rack_and_block_and_an_admin_label_wins_over_the_agents() -> None:
    labels = node_labels(status({"rack": "agent-says"}), {"rack": "r1", "block": "b2"})
    assert (labels["rack"], labels["block"]) == ("r1", "b2")
    assert node_labels(status({"rack": "r7"}), None)["rack"] == "r7"
    assert "rack" not in node_labels(status({}), None)


def test_an_empty_zone_or_region_is_no_label() -> None:
    labels = node_labels(status({}, zone="", region=""), None)
    assert "zone" not in labels
    assert "region" not in labels


def test_an_admin_may_set_rack_but_not_the_derived_labels() -> None:
    assert reserved_label_error("rack") is None
    assert reserved_label_error("team") is None
    for key in ("site", "zone", "region", "hostname"):
        error = reserved_label_error(key)
        assert error is not None
        assert key in error
