"""Topic names of the v1 contract: building, parsing and what is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.topics import (
    DEFAULT_TOPIC_ROOT,
    Channel,
    NodeTopic,
    TopicError,
    Topics,
    is_valid_node_id,
    validate_root,
)

VALID_NODE_IDS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", fullmatch=True)
VALID_ROOTS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", fullmatch=True)


@pytest.mark.parametrize("channel", list(Channel))
def test_a_node_topic_is_root_version_nodes_id_channel(channel: Channel) -> None:
    assert Topics().node("rpi5-frankfurt-3", channel) == (
        f"greenfed/v1/nodes/rpi5-frankfurt-3/{channel.value}"
    )


@pytest.mark.parametrize("channel", list(Channel))
def test_every_built_topic_parses_back_to_its_node_and_channel(channel: Channel) -> None:
    topics = Topics()
    assert topics.parse(topics.node("h100.la_2", channel)) == NodeTopic("h100.la_2", channel)


def test_the_default_root_is_greenfed() -> None:
    assert DEFAULT_TOPIC_ROOT == "greenfed"
    assert Topics().nodes_prefix == "greenfed/v1/nodes/"


def test_a_custom_root_builds_and_parses_its_own_topics() -> None:
    topics = Topics("test-run_7")
    topic = topics.node("n1", Channel.TELEMETRY)
    assert topic == "test-run_7/v1/nodes/n1/telemetry"
    assert topics.parse(topic) == NodeTopic("n1", Channel.TELEMETRY)


def test_installations_with_different_roots_do_not_parse_each_others_topics() -> None:
    ours, theirs = Topics("ours"), Topics("theirs")
    with pytest.raises(TopicError):
        ours.parse(theirs.node("n1", Channel.STATUS))


def test_the_subscription_filter_matches_one_channel_of_every_node() -> None:
    assert Topics().all_nodes(Channel.STATUS) == "greenfed/v1/nodes/+/status"
    assert Topics("x").all_nodes(Channel.EVENTS) == "x/v1/nodes/+/events"


@pytest.mark.parametrize(
    "topic",
    [
        "other/v1/nodes/n1/status",
        "greenfed/v2/nodes/n1/status",
        "greenfed/v1/node/n1/status",
        "greenfedx/v1/nodes/n1/status",
        "/greenfed/v1/nodes/n1/status",
        "greenfed/v1/nodes",
        "",
    ],
)
def test_topics_outside_the_prefix_are_refused(topic: str) -> None:
    with pytest.raises(TopicError, match="outside"):
        Topics().parse(topic)


@pytest.mark.parametrize(
    "topic",
    [
        "greenfed/v1/nodes/+/status",
        "greenfed/v1/nodes/#/status",
        "greenfed/v1/nodes/n+1/status",
        "greenfed/v1/nodes//status",
        "greenfed/v1/nodes/-n1/status",
        "greenfed/v1/nodes/n1",
        "greenfed/v1/nodes/",
        f"greenfed/v1/nodes/{'n' * 129}/status",
    ],
)
def test_topics_without_a_valid_node_id_are_refused(topic: str) -> None:
    with pytest.raises(TopicError, match="node id"):
        Topics().parse(topic)


@pytest.mark.parametrize(
    "topic",
    [
        "greenfed/v1/nodes/n1/heartbeat",
        "greenfed/v1/nodes/n1/",
        "greenfed/v1/nodes/n1/Status",
        "greenfed/v1/nodes/n1/status/extra",
        "greenfed/v1/nodes/n1/status/",
        "greenfed/v1/nodes/n1/#",
    ],
)
def test_unknown_channels_and_extra_levels_are_refused(topic: str) -> None:
    with pytest.raises(TopicError, match="unknown channel"):
        Topics().parse(topic)


@pytest.mark.parametrize("node_id", ["", "a/b", "+", "#", "a+", "-a", ".a", "a b", "n" * 129])
def test_building_a_topic_for_an_invalid_node_id_is_refused(node_id: str) -> None:
    assert not is_valid_node_id(node_id)
    with pytest.raises(TopicError):
        Topics().node(node_id, Channel.STATUS)


@pytest.mark.parametrize("root", ["", "a/b", "+", "#", "green fed", "-lead", "r" * 65])
def test_an_invalid_root_is_refused(root: str) -> None:
    with pytest.raises(TopicError, match="topic root"):
        validate_root(root)
    with pytest.raises(TopicError):
        Topics(root)


def test_a_root_of_64_characters_is_accepted() -> None:
    assert Topics("r" * 64).nodes_prefix == f"{'r' * 64}/v1/nodes/"


def test_a_node_id_or_root_with_a_trailing_newline_is_refused() -> None:
    assert not is_valid_node_id("node-1\n")
    with pytest.raises(TopicError):
        validate_root("greenfed\n")


@given(node_id=VALID_NODE_IDS, channel=st.sampled_from(Channel), root=VALID_ROOTS)
def test_parse_inverts_node_for_any_valid_node_id_channel_and_root(
    node_id: str, channel: Channel, root: str
) -> None:
    topics = Topics(root)
    assert topics.parse(topics.node(node_id, channel)) == NodeTopic(node_id, channel)


@given(node_id=VALID_NODE_IDS)
def test_a_valid_node_id_is_exactly_one_topic_level_without_wildcards(node_id: str) -> None:
    topic = Topics().node(node_id, Channel.TELEMETRY)
    assert topic.split("/")[3] == node_id
    assert len(topic.split("/")) == 5
    assert not {"+", "#"} & set(node_id)
