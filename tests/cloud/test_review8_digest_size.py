"""A sample as large as a node may send, with the longest index entry it can have, still
reaches the other replicas in a digest, and so does the heartbeat of its interval
(cloud/fleet/digest.py `max_digest_bytes`, `DigestBuilder.take`)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from cloud.fleet.digest import (
    MAX_INSTANCE_ID_CHARS,
    MAX_NODE_ID_CHARS,
    MAX_SEQ,
    RELAYED_DIGEST_DECODER,
    DigestBuilder,
    max_digest_bytes,
)
from cloud.fleet.ingest import DIGEST_CHANNEL, Ingestor
from cloud.fleet.registry import NodeRegistry
from shared.messages import DeploymentSample, Telemetry, encode
from shared.topics import Channel
from tests.cloud.test_ingest_unit import TOPICS, FakeClock, birth, sample, topic

pytestmark = pytest.mark.timeout(30)

MAX_PAYLOAD_BYTES = 16384
DIGEST_TOPIC = TOPICS.telemetry_digest
NODE_ID = "n" * MAX_NODE_ID_CHARS
# Each character 4 bytes of UTF-8: the longest a birth's instance id (no control
# characters), and so an accepted sample's, encodes to.
WIDE_INSTANCE_ID = "\U0001d11e" * MAX_INSTANCE_ID_CHARS
# Each character escaped as `\u001f` (6 bytes): the longest any string of that length
# encodes to.
ESCAPED_INSTANCE_ID = "\x1f" * MAX_INSTANCE_ID_CHARS


def replica(clock: FakeClock, instance_id: str) -> Ingestor:
    registry = NodeRegistry(monotonic=clock.monotonic, wall_clock=clock.wall)
    ingestor = Ingestor(registry, TOPICS, max_payload_bytes=MAX_PAYLOAD_BYTES, shared_group="cloud")
    ingestor.handle(topic(NODE_ID, Channel.STATUS), encode(birth(NODE_ID, instance_id)))
    return ingestor


class EchoingClient:
    """Hands each link probe straight back to its replica, as the broker would."""

    def __init__(self, ingestor: Ingestor) -> None:
        self.ingestor = ingestor
        self.echoed = asyncio.Event()

    async def publish(self, topic: str, payload: bytes, *, qos: int) -> None:
        self.ingestor.handle(topic, payload)
        self.echoed.set()


async def prove_link(ingestor: Ingestor) -> None:
    """One probe sent and back: the replica's digests are heartbeats from now on."""
    client = EchoingClient(ingestor)
    task = asyncio.create_task(ingestor.link_probe.run(client))  # type: ignore[arg-type]
    try:
        async with asyncio.timeout(5):
            await client.echoed.wait()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert ingestor.link_probe.unproven_s() == 0.0


def largest_sample(instance_id: str, seq: int) -> bytes:
    """A sample of `NODE_ID` padded with deployments to exactly MAX_PAYLOAD_BYTES."""
    base = sample(NODE_ID, instance_id, seq=seq)
    deployments: list[DeploymentSample] = []
    while True:
        padded = msgspec.structs.replace(base, deployments=tuple(deployments))
        left_bytes = MAX_PAYLOAD_BYTES - len(encode(padded))
        if left_bytes == 0:
            return encode(padded)
        empty = DeploymentSample(
            deployment_id="", requests=0, errors=0, rejected=0, requests_per_s=0.0
        )
        # The first deployment adds no comma; each character of an id adds one byte.
        overhead = len(encode(empty)) + (1 if deployments else 0)
        id_chars = min(200, left_bytes - overhead)
        ordinal = f"{len(deployments):04d}"  # deployments' ids differ
        if id_chars < len(ordinal):  # too little left for another: lengthen the last id
            last = deployments.pop()
            longer = last.deployment_id + "d" * left_bytes
            assert len(longer) <= 256
            deployments.append(msgspec.structs.replace(last, deployment_id=longer))
            continue
        deployments.append(
            msgspec.structs.replace(empty, deployment_id=ordinal + "d" * (id_chars - 4))
        )


def test_the_wire_bounds_are_those_the_index_allowance_is_made_of() -> None:
    decoder = msgspec.json.Decoder(Telemetry)
    fits = msgspec.structs.replace(sample(NODE_ID), seq=MAX_SEQ)
    assert decoder.decode(encode(fits)).seq == MAX_SEQ
    for too_much in (
        msgspec.structs.replace(fits, seq=MAX_SEQ + 1),
        msgspec.structs.replace(fits, node_id=NODE_ID + "n"),
    ):
        with pytest.raises(msgspec.ValidationError):
            decoder.decode(encode(too_much))
    assert len(msgspec.json.encode(ESCAPED_INSTANCE_ID)) == 2 + 6 * MAX_INSTANCE_ID_CHARS


async def test_a_largest_sample_and_its_heartbeat_reach_the_other_replica() -> None:
    instance_id, seq = WIDE_INSTANCE_ID, 7
    clock = FakeClock()
    taker, other = replica(clock, instance_id), replica(clock, instance_id)
    await prove_link(taker)
    payload = largest_sample(instance_id, seq)
    assert len(payload) == MAX_PAYLOAD_BYTES

    taker.handle(topic(NODE_ID, Channel.TELEMETRY), payload)
    assert taker.stats.ingested[Channel.TELEMETRY] == 1
    messages = taker.digest.take(clock.wall())
    for message in messages:
        other.handle(DIGEST_TOPIC, message)

    assert dict(other.stats.invalid) == {}
    assert other.stats.ingested[DIGEST_CHANNEL] == 1
    record = other.registry.get(NODE_ID)
    assert record is not None
    assert record.telemetry_seq == seq
    assert record.telemetry is not None
    assert record.telemetry.instance_id == instance_id
    # The taker's heartbeat counted: the other replica waits for its share from now on.
    assert len(other.digest_peers) == 1
    assert other.digest_peers.relayed_until_s() == clock.monotonic()
    assert all(len(message) <= max_digest_bytes(MAX_PAYLOAD_BYTES) for message in messages)


def test_a_sample_over_the_budget_goes_alone_and_its_heartbeat_after_it() -> None:
    """Were the oversized message lost or refused, the interval's heartbeat (or goodbye)
    still arrives: it travels on its own."""
    builder = DigestBuilder(
        "replica-a", max_payload_bytes=MAX_PAYLOAD_BYTES, unproven_s=lambda: 0.0
    )
    builder.observe(sample("n2", seq=3))
    builder.observe(
        msgspec.json.decode(largest_sample(WIDE_INSTANCE_ID, 9), type=Telemetry),
        largest_sample(WIDE_INSTANCE_ID, 9),
    )
    decoded = [RELAYED_DIGEST_DECODER.decode(m) for m in builder.take(1.0, goodbye=True)]
    assert [(d.nodes, d.heartbeat, d.goodbye) for d in decoded] == [
        (("n2",), False, False),
        ((NODE_ID,), False, False),
        ((), True, True),
    ]
    assert (builder.published, builder.published_samples) == (2, 2)


def test_no_sample_a_node_may_send_makes_a_digest_the_others_refuse() -> None:
    """The longest index entry the wire allows, on a sample as large as a node may send
    (as the builder gets it, whatever the registry would make of it)."""
    builder = DigestBuilder("replica-a", max_payload_bytes=MAX_PAYLOAD_BYTES)
    payload = largest_sample(ESCAPED_INSTANCE_ID, MAX_SEQ)
    builder.observe(msgspec.json.decode(payload, type=Telemetry), payload)
    (message,) = (m for m in builder.take(1.0) if NODE_ID.encode() in m)
    assert len(message) <= max_digest_bytes(MAX_PAYLOAD_BYTES)
    (relayed,) = RELAYED_DIGEST_DECODER.decode(message).samples
    assert bytes(relayed) == payload
