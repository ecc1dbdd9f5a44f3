"""Control-plane replicas sharing nodes' telemetry on the real Mosquitto
(`mqtt.shared_group`, cloud/fleet/digest.py): the broker hands each sample to one
replica, every replica's registry still sees every node's latest figures through the
others' digests, and the leader meters every node's usage exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiomqtt
import msgspec
import pytest
import structlog

from cloud.fleet.digest import TelemetryDigest
from cloud.fleet.ingest import DIGEST_CHANNEL, Ingestor
from cloud.fleet.registry import NodeRegistry
from cloud.signals.grid import GridSignals
from cloud.store import AllocationRecord, StoreSnapshot, UsageMark, UsageWrite, open_store
from cloud.usage.accountant import Accountant
from shared.messages import AcceleratorSample, NodeStatus, Telemetry, encode
from shared.settings import MqttSettings, StoreSettings, UsageSettings, parse_mqtt_url
from shared.tasks import stop_task
from shared.topics import Channel, Topics
from sim_devices.probes import SimulatedNode
from sim_devices.profiles import get_profile
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)

NODES = [f"shared-{index}" for index in range(8)]
SAMPLES_PER_NODE = 12
INTERVAL_S = 0.05
GPU_POWER_W = 60.0
CPU_POWER_W = 20.0


def birth(node_id: str) -> NodeStatus:
    node = SimulatedNode(node_id, get_profile("t4-inference-server"), random.Random(node_id))
    now = time.time()
    return NodeStatus(
        node_id=node_id,
        state="online",
        instance_id="agent-1",
        agent_version="test",
        site="edge",
        zone="DE",
        region="europe-west3",
        host=node.host_info(),
        accelerators=node.accelerators,
        telemetry_interval_s=INTERVAL_S,
        started_at=now - 60.0,
        sent_at=now,
    )


def sample(node_id: str, seq: int, sampled_at: float) -> Telemetry:
    """With energy counters: what is metered over any run of samples is their difference,
    however many of them a replica coalesced."""
    return Telemetry(
        node_id=node_id,
        instance_id="agent-1",
        seq=seq,
        sampled_at=sampled_at,
        interval_s=INTERVAL_S,
        cpu_utilization_pct=float(NODES.index(node_id)),
        memory_used_bytes=seq,
        memory_total_bytes=2**34,
        accelerators=(
            AcceleratorSample(
                id="cpu0",
                utilization_pct=30.0,
                memory_used_bytes=0,
                power_w=CPU_POWER_W,
                energy_j=CPU_POWER_W * INTERVAL_S * seq,
            ),
            AcceleratorSample(
                id="gpu0",
                utilization_pct=70.0,
                memory_used_bytes=2**30,
                power_w=GPU_POWER_W,
                energy_j=GPU_POWER_W * INTERVAL_S * seq,
            ),
        ),
    )


def samples(first_seq: int = 1, last_seq: int = SAMPLES_PER_NODE) -> list[Telemetry]:
    """Every node's samples in the order an agent sends them, spaced by its interval."""
    start = time.time() - last_seq * INTERVAL_S
    return [
        sample(node_id, seq, start + seq * INTERVAL_S)
        for seq in range(first_seq, last_seq + 1)
        for node_id in NODES
    ]


def replica(url: str, root: str, group: str) -> Ingestor:
    registry = NodeRegistry()
    return Ingestor(
        registry,
        Topics(root),
        max_payload_bytes=MqttSettings().max_payload_bytes,
        shared_group=group,
        digest_interval_s=0.1,
    )


@contextlib.asynccontextmanager
async def running(url: str, root: str, ingestors: Sequence[Ingestor]) -> AsyncIterator[None]:
    settings = MqttSettings(url=url, topic_root=root)
    tasks = [
        asyncio.create_task(i.run(i.session(settings, client_id=f"replica-{uuid.uuid4().hex}")))
        for i in ingestors
    ]
    try:
        for ingestor in ingestors:
            await asyncio.wait_for(ingestor.subscribed.wait(), 10)
        yield
    finally:
        for task in tasks:
            await stop_task(task)


async def publish_fleet(url: str, root: str, ingestors: Sequence[Ingestor]) -> list[Telemetry]:
    """Births (retained) until every replica knows every node, then the samples."""
    endpoint = parse_mqtt_url(url)
    topics = Topics(root)
    sent = samples()
    async with aiomqtt.Client(endpoint.host, endpoint.port) as agent:
        for node_id in NODES:
            status = topics.node(node_id, Channel.STATUS)
            await agent.publish(status, encode(birth(node_id)), qos=1, retain=True)
        await eventually(
            lambda: all(len(i.registry) == len(NODES) for i in ingestors),
            message="births reached every replica",
        )
        for telemetry in sent:
            topic = topics.node(telemetry.node_id, Channel.TELEMETRY)
            await agent.publish(topic, encode(telemetry), qos=1)
    return sent


def sees_every_last_sample(ingestor: Ingestor, last_seq: int = SAMPLES_PER_NODE) -> bool:
    for node_id in NODES:
        record = ingestor.registry.get(node_id)
        if record is None or record.telemetry is None:
            return False
        if record.telemetry.seq != last_seq:
            return False
    return True


async def test_replicas_share_the_telemetry_and_each_sees_every_node(
    mosquitto_root: tuple[str, str],
) -> None:
    url, root = mosquitto_root
    group = f"g-{uuid.uuid4().hex[:8]}"
    first, second = replica(url, root, group), replica(url, root, group)
    async with running(url, root, [first, second]):
        await publish_fleet(url, root, [first, second])
        await eventually(
            lambda: sees_every_last_sample(first) and sees_every_last_sample(second),
            message=lambda: f"last samples: {first.stats.ingested}, {second.stats.ingested}",
        )

    took = [i.stats.ingested[Channel.TELEMETRY] for i in (first, second)]
    assert sum(took) == len(NODES) * SAMPLES_PER_NODE  # each sample to one replica
    assert min(took) > 0  # both took a share
    assert first.stats.ingested[DIGEST_CHANNEL] > 0
    assert second.stats.ingested[DIGEST_CHANNEL] > 0
    for ingestor in (first, second):
        for node_id in NODES:
            record = ingestor.registry.get(node_id)
            assert record is not None
            assert record.telemetry is not None
            assert record.telemetry.cpu_utilization_pct == NODES.index(node_id)
            assert record.telemetry.memory_used_bytes == SAMPLES_PER_NODE
        assert ingestor.stats.invalid_total == 0


async def test_a_digest_from_anyone_but_a_replica_is_checked_like_a_sample(
    mosquitto_root: tuple[str, str],
) -> None:
    """The anonymous broker lets anyone write the digest topic (a broker with accounts
    does not: tests/integration/test_broker_acl.py): a forged sample still has to pass
    every check a node's own sample does."""
    url, root = mosquitto_root
    group = f"g-{uuid.uuid4().hex[:8]}"
    ingestor = replica(url, root, group)
    async with running(url, root, [ingestor]):
        await publish_fleet(url, root, [ingestor])
        await eventually(lambda: sees_every_last_sample(ingestor))
        forged = TelemetryDigest(
            replica_id="replica-forger",
            sent_at=time.time(),
            samples=(
                # Another agent instance, and a sequence number no agent reached so soon.
                msgspec.structs.replace(
                    sample(NODES[0], SAMPLES_PER_NODE + 1, time.time()), instance_id="impostor"
                ),
                sample(NODES[1], 10**9, time.time()),
            ),
        )
        endpoint = parse_mqtt_url(url)
        async with aiomqtt.Client(endpoint.host, endpoint.port) as forger:
            await forger.publish(Topics(root).telemetry_digest, encode(forged), qos=1)
            await forger.publish(Topics(root).telemetry_digest, b"{]", qos=1)
        await eventually(lambda: ingestor.stats.invalid_total == 3)

    assert dict(ingestor.stats.invalid) == {
        (DIGEST_CHANNEL, "instance_mismatch"): 1,
        (DIGEST_CHANNEL, "seq_jump"): 1,
        (DIGEST_CHANNEL, "malformed_json"): 1,
    }
    for node_id in NODES[:2]:
        record = ingestor.registry.get(node_id)
        assert record is not None
        assert record.telemetry is not None
        assert (record.telemetry.instance_id, record.telemetry.seq) == ("agent-1", 12)


@contextlib.asynccontextmanager
async def metering(data_dir: Path, registry: NodeRegistry) -> AsyncIterator[Accountant]:
    """The leader's accountant: every node runs one job on its GPU, counted from a mark
    at counter 0 (as a leader that ran before would have it)."""
    store = await open_store(StoreSettings(data_dir=str(data_dir)))
    lease = await store.try_acquire_leadership()
    assert lease is not None
    now = time.time() - 60.0
    await store.write_usage(
        UsageWrite(
            marks=[
                UsageMark(node_id, "agent-1", 0, now, {"cpu0": 0.0, "gpu0": 0.0})
                for node_id in NODES
            ]
        ),
        lease=lease,
    )
    accountant = Accountant(store, registry, UsageSettings())
    allocations = tuple(
        AllocationRecord(
            work_id=f"job-{node_id}",
            member_index=0,
            node_id=node_id,
            accelerator_kind="gpu",
            accelerators=1,
            accelerator_ids=("gpu0",),
            host_memory_bytes=0,
            started_at=now,
            expected_end=None,
            borrowed=False,
            state="running",
            tenant_id="t",
            work_kind="training",
            priority="p1",
        )
        for node_id in NODES
    )
    snapshot = StoreSnapshot(tenants=(), work=(), allocations=allocations, node_generations={})
    await accountant.begin(lease)
    accountant.note_pass(snapshot, GridSignals(now_s=now, zones={}))
    try:
        yield accountant
        await accountant.flush(lease)
    finally:
        await lease.release()
        await store.close()


def metered_j(accountant: Accountant) -> float:
    return sum(totals.energy_j for totals in accountant.totals.values())


async def metered_alone(data_dir: Path, sent: Sequence[Telemetry]) -> float:
    """The energy one process that heard every one of `sent` meters."""
    alone = NodeRegistry()
    for node_id in NODES:
        alone.apply_status(birth(node_id))
    async with metering(data_dir, alone) as reference:
        for telemetry in sent:
            assert alone.apply_telemetry(telemetry) is None
            reference.observe(telemetry)
    return metered_j(reference)


async def test_usage_is_metered_once_across_replicas(
    mosquitto_root: tuple[str, str], tmp_path: Path
) -> None:
    url, root = mosquitto_root
    group = f"g-{uuid.uuid4().hex[:8]}"
    leader, other = replica(url, root, group), replica(url, root, group)
    async with metering(tmp_path / "leader", leader.registry) as accountant:
        leader.telemetry_listeners.append(accountant.observe)
        leader.digest_listeners.append(accountant.observe)  # as cloud/app.py wires it
        leader.relayed_wanted = accountant.relayed
        async with running(url, root, [leader, other]):
            sent = await publish_fleet(url, root, [leader, other])
            await eventually(lambda: sees_every_last_sample(leader))
        assert min(i.stats.ingested[Channel.TELEMETRY] for i in (leader, other)) > 0

    reference_j = await metered_alone(tmp_path / "alone", sent)
    assert reference_j > 0
    assert metered_j(accountant) == pytest.approx(reference_j, rel=1e-9)


# A replica in a process of its own, to be killed: what it has heard, on stdout.
REPLICA_LINE = "replica-heard"
REPOSITORY = Path(__file__).resolve().parents[2]


def doomed_replica(url: str, root: str, group: str) -> None:
    """Run one replica until killed, printing `REPLICA_LINE <nodes known> <samples
    taken>` every 10 ms (its log lines go to stderr)."""
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))

    async def main() -> None:
        ingestor = replica(url, root, group)
        settings = MqttSettings(url=url, topic_root=root)
        session = ingestor.session(settings, client_id=f"doomed-{uuid.uuid4().hex}")
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(ingestor.run(session))
            await asyncio.wait_for(ingestor.subscribed.wait(), 30)
            while True:
                taken = ingestor.stats.ingested[Channel.TELEMETRY]
                print(REPLICA_LINE, len(ingestor.registry), taken, flush=True)
                await asyncio.sleep(0.01)

    asyncio.run(main())


class DoomedReplica:
    """`doomed_replica` in a child process, and what it last said it heard."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.known_nodes = 0
        self.taken = 0

    @classmethod
    @contextlib.asynccontextmanager
    async def started(cls, url: str, root: str, group: str) -> AsyncIterator[DoomedReplica]:
        code = (
            "from tests.integration.test_shared_ingestion import doomed_replica; "
            f"doomed_replica({url!r}, {root!r}, {group!r})"
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            cwd=REPOSITORY,
            env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
            stdout=asyncio.subprocess.PIPE,  # its log lines: stderr, which pytest shows
        )
        doomed = cls(process)
        async with asyncio.TaskGroup() as tasks:
            reading = tasks.create_task(doomed._read())
            try:
                yield doomed
            finally:
                if process.returncode is None:
                    process.kill()
                await process.wait()
                await stop_task(reading)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            words = line.decode(errors="replace").split()
            if len(words) == 3 and words[0] == REPLICA_LINE:
                self.known_nodes, self.taken = int(words[1]), int(words[2])

    async def kill(self) -> None:
        """SIGKILL: no DISCONNECT, no last digest; the broker sees the socket close."""
        self.process.send_signal(signal.SIGKILL)
        assert await self.process.wait() == -signal.SIGKILL


async def test_a_replica_killed_mid_stream_loses_and_double_counts_nothing(
    mosquitto_root: tuple[str, str], tmp_path: Path
) -> None:
    """Three replicas share telemetry; one (not the leader) is SIGKILLed while the nodes'
    samples flow. The two left take every later sample between them, both keep every
    node current, and the leader meters exactly what one process that heard every
    sample meters: the samples the dead replica took and never digested are covered by
    the energy counters' difference to the next one, and nothing is counted twice."""
    url, root = mosquitto_root
    group = f"g-{uuid.uuid4().hex[:8]}"
    leader, survivor = replica(url, root, group), replica(url, root, group)
    survivors = (leader, survivor)
    endpoint = parse_mqtt_url(url)
    topics = Topics(root)
    sent: list[Telemetry] = []

    async def publish(agent: aiomqtt.Client, telemetry: Sequence[Telemetry]) -> None:
        for one in telemetry:
            await agent.publish(topics.node(one.node_id, Channel.TELEMETRY), encode(one), qos=1)
            sent.append(one)

    def taken(ingestor: Ingestor) -> int:
        return ingestor.stats.ingested[Channel.TELEMETRY]

    async with (
        metering(tmp_path / "leader", leader.registry) as accountant,
        DoomedReplica.started(url, root, group) as doomed,
    ):
        leader.telemetry_listeners.append(accountant.observe)
        leader.digest_listeners.append(accountant.observe)  # as cloud/app.py wires it
        leader.relayed_wanted = accountant.relayed
        async with (
            running(url, root, survivors),
            aiomqtt.Client(endpoint.host, endpoint.port) as agent,
        ):
            for node_id in NODES:
                status = topics.node(node_id, Channel.STATUS)
                await agent.publish(status, encode(birth(node_id)), qos=1, retain=True)
            await eventually(
                lambda: (
                    all(len(i.registry) == len(NODES) for i in survivors)
                    and doomed.known_nodes == len(NODES)
                ),
                timeout_s=30,  # the child process imports the control plane first
                message="births reached every replica",
            )
            # Samples flow, a round of every node's at a time, while the doomed replica
            # takes its share; it dies in the middle of the stream, which goes on.
            killed = asyncio.Event()

            async def stream() -> int:
                seq, rounds_after_kill = 0, 0
                while rounds_after_kill < SAMPLES_PER_NODE:
                    seq += 1
                    await publish(agent, samples(seq, seq))
                    rounds_after_kill += killed.is_set()
                    # A round per interval, as agents send: each sample's counters grow by
                    # its power over the interval, and samples closer together than that
                    # would claim more power than the devices have (the meter refuses
                    # such figures: cloud/usage/meter.py).
                    await asyncio.sleep(INTERVAL_S)
                return seq

            async with asyncio.TaskGroup() as tasks:
                streaming = tasks.create_task(stream())
                await eventually(
                    lambda: doomed.taken >= len(NODES), message="the doomed replica took no share"
                )
                await doomed.kill()
                killed.set()
                taken_by_doomed = doomed.taken  # what it had taken when it last said so
                taken_at_kill = [taken(i) for i in survivors]
            last_seq = streaming.result()

            # A sample the broker wrote to the dead socket before it saw it close is lost
            # with it (QoS 0): rounds go on until the latest reached both survivors
            # (normally the stream's own last round already did).
            def survivors_current() -> bool:
                return all(sees_every_last_sample(i, last_seq) for i in survivors)

            for _ in range(20):
                with contextlib.suppress(AssertionError):
                    await eventually(survivors_current, timeout_s=3)
                    break
                await publish(agent, samples(last_seq + 1, last_seq + 1))
                last_seq += 1
            assert survivors_current(), (
                f"survivors not current at seq {last_seq}: {[i.stats.ingested for i in survivors]}"
            )

    # Both survivors took a share of the samples after the kill: the broker gave the dead
    # replica's share to them.
    for before, ingestor in zip(taken_at_kill, survivors, strict=True):
        assert taken(ingestor) > before
    # Each sample to one replica at most: nothing delivered twice.
    assert taken_by_doomed > 0
    assert sum(taken(i) for i in survivors) + taken_by_doomed <= len(sent)
    for ingestor in survivors:
        assert ingestor.stats.invalid_total == 0
        assert ingestor.stats.failures == 0

    reference_j = await metered_alone(tmp_path / "alone", sent)
    assert reference_j == pytest.approx(
        len(NODES) * (GPU_POWER_W + CPU_POWER_W) * INTERVAL_S * last_seq, rel=1e-9
    )
    assert metered_j(accountant) == pytest.approx(reference_j, rel=1e-9)
