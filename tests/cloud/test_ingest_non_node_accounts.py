"""Some broker accounts are never a node, whatever a broker lets them publish. An ACL
file gives every account a node's rights under its own name (Mosquitto applies
`pattern` lines to all users), and deploy/mosquitto/greenfed.acl named the telemetry
reader `greenfed-reader` in the agents' password file until readers had a listener of
their own: a broker set up so lets that read-only account publish a birth as node
`greenfed-reader`. The control plane drops every message of a node id that is its own
MQTT username or that reader's, counted and logged as a node not admitted."""

from __future__ import annotations

from collections import Counter

from cloud.app import create_app
from cloud.app_keys import INGESTOR
from cloud.fleet.ingest import Ingestor, non_node_accounts_of
from cloud.fleet.registry import NodeRegistry
from shared.messages import encode
from shared.settings import MqttSettings, Settings
from shared.topics import Channel, Topics
from tests.cloud.test_ingest_unit import MAX_PAYLOAD_BYTES, FakeClock, birth, sample

TOPICS = Topics("greenfed")


def _registry() -> NodeRegistry:
    clock = FakeClock()  # the births' and samples' times are plausible by it
    return NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall)


def _send_birth_and_sample(ingestor: Ingestor, node_id: str) -> None:
    ingestor.handle(TOPICS.node(node_id, Channel.STATUS), encode(birth(node_id=node_id)))
    ingestor.handle(TOPICS.node(node_id, Channel.TELEMETRY), encode(sample(node_id=node_id)))


def test_the_control_plane_account_and_the_shipped_reader_are_never_nodes() -> None:
    ingestor = Ingestor(
        _registry(),
        TOPICS,
        max_payload_bytes=MAX_PAYLOAD_BYTES,
        non_node_accounts=non_node_accounts_of("greenfed-cloud"),
    )
    for node_id in ("greenfed-cloud", "greenfed-reader", "orin-1"):
        _send_birth_and_sample(ingestor, node_id)

    assert [record.node_id for record in ingestor.registry.nodes()] == ["orin-1"]
    assert ingestor.stats.invalid == Counter(
        {("status", "not_enrolled"): 2, ("telemetry", "not_enrolled"): 2}
    )


def test_without_a_username_only_the_shipped_reader_is_never_a_node() -> None:
    assert non_node_accounts_of(None) == frozenset({"greenfed-reader"})
    assert non_node_accounts_of("") == frozenset({"greenfed-reader"})


def test_the_control_plane_refuses_its_own_mqtt_username_as_a_node() -> None:
    """As `greenfed cloud` is wired: whatever its account is named."""
    settings = Settings(mqtt=MqttSettings(username="fleet-control"))
    ingestor = create_app(settings, _registry())[INGESTOR]
    for node_id in ("fleet-control", "greenfed-reader", "orin-1"):
        _send_birth_and_sample(ingestor, node_id)

    assert [record.node_id for record in ingestor.registry.nodes()] == ["orin-1"]
    assert ingestor.stats.invalid[("status", "not_enrolled")] == 2
