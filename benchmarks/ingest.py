"""Cloud ingestion throughput over a real broker.

A publisher process sends telemetry of `--nodes` nodes through the broker at a
fixed rate; this process runs the control plane's real ingestion (MQTT session,
decoding, validation, registry updates) and counts what arrives. Each rate of
the sweep runs for `--seconds`.

Per rate:
- `ingested`: messages decoded and applied to the registry;
- `consumer_drops`: messages that reached the ingesting client but were not
  applied (invalid, queue overflow); the target is zero;
- `broker_losses`: messages sent but never delivered (QoS 0 lets a broker drop
  them for a subscriber that falls behind);
- `consumer_cpu_pct`: CPU of the ingesting process, percent of one core;
- `ingested_per_cpu_s`: messages per CPU second, the rate one busy core sustains.

With `--accounting` the live accountant (cloud/usage/) meters every sample as the
leader does: every node runs a job on its GPU, and usage is flushed to a SQLite store
every `usage.flush_interval_s` (`usage_rows_written`, `usage_flush_ms` report it).

`--consumer paho` measures, on the same rig, a bare paho client whose `on_message`
only counts: the ceiling one Python process reaches on this broker.

`--replicas 1,2,3` runs that many control-plane replicas, each a process of its own
taking telemetry through one MQTT shared subscription (`mqtt.shared_group`) and
merging the others' digests (cloud/fleet/digest.py), as `greenfed cloud` replicas
do. Per replica it reports what it took itself (`ingested`), what it merged from
digests (`merged`), its CPU, and how many nodes its registry saw up to their last
sample (`nodes_current`: every replica should see every node); per rate,
`fleet_samples_per_busiest_replica_cpu_s`, the fleet's samples per CPU second of the
busiest replica (at a lossless rate: what N replicas of a core each would take). With `--accounting`
the first replica meters, as the leader does: `usage_energy_j` is what it metered,
the same whatever the number of replicas when nothing is counted twice.
`--replica-cores 0.1` holds each replica to a tenth of a core (a CFS quota in a cgroup of
its own, made as the agent makes a training worker's, edge/sandbox/cgroups.py; root
only), so that N replicas have N times one replica's CPU on a machine with fewer cores
than replicas, broker and publisher need.

    python benchmarks/ingest.py --mqtt-url mqtt://127.0.0.1:1883 --rates 5000,10000,15000,20000
    python benchmarks/ingest.py --accounting --rates 10000,15000
    python benchmarks/ingest.py --consumer paho --rates 15000,20000,25000
    python benchmarks/ingest.py --replicas 1,2,3 --rates 10000,15000,20000,25000
    python benchmarks/ingest.py --replicas 1,2,3 --replica-cores 0.1 --rates 2000,4000,6000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import multiprocessing
import multiprocessing.synchronize
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from multiprocessing.queues import Queue
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cloud.fleet.ingest import DIGEST_CHANNEL, Ingestor
from cloud.fleet.registry import NodeRegistry
from cloud.green.window import static_carbon_g_per_kwh, static_price_per_mwh
from cloud.signals.grid import GridSignals
from cloud.store import (
    AllocationRecord,
    StoreSnapshot,
    UsageMark,
    UsageWrite,
    open_store,
)
from cloud.usage.accountant import Accountant
from edge.sandbox.cgroup_files import join, remove_groups
from edge.sandbox.cgroups import WorkerCgroups, WorkerLimits, discover_layout
from shared.messages import AcceleratorSample, NodeStatus, Telemetry, encode
from shared.settings import MqttSettings, StoreSettings, UsageSettings, parse_mqtt_url
from shared.topics import Channel, Topics
from sim_devices.probes import SimulatedNode
from sim_devices.profiles import get_profile

TICK_S = 0.01
SAMPLE_INTERVAL_S = 0.05
# Waits without anything new after which a replica that has not heard every node's
# last sample stops waiting for it (and reports it missing).
SETTLE_QUIET_WAITS = 3
# How often a replica reads every node's latest figures, as a Prometheus scrape of its
# /metrics does (the accelerator gauges): what another replica relayed is decoded then.
READ_FIGURES_EVERY_S = 15.0


def node_ids(count: int) -> list[str]:
    return [f"bench-{index:05d}" for index in range(count)]


def birth(node_id: str) -> NodeStatus:
    node = SimulatedNode(node_id, get_profile("t4-inference-server"), random.Random(node_id))
    return NodeStatus(
        node_id=node_id,
        state="online",
        instance_id="bench",
        agent_version="bench",
        site="edge",
        zone="DE",
        region="europe-west3",
        host=node.host_info(),
        accelerators=node.accelerators,
        # The interval the nodes really keep at the sweep's top rate (20 samples/s per
        # node): ingestion bounds each node's sequence numbers by its announced interval.
        telemetry_interval_s=SAMPLE_INTERVAL_S,
        # Real clock times: ingestion refuses timestamps beyond cloud.max_clock_skew_s,
        # and sequence numbers that outrun the time since the agent started.
        started_at=time.time() - 3600.0,
        sent_at=time.time(),
    )


def telemetry(node_id: str, seq: int, sampled_at: float | None = None) -> bytes:
    """A realistic 2-accelerator sample (about 500 bytes), its counters at `seq`
    intervals of their power; taken at `sampled_at` (None: now)."""
    samples = (
        AcceleratorSample(
            id="cpu0",
            utilization_pct=41.5,
            memory_used_bytes=2**34,
            power_w=88.1,
            energy_j=88.1 * SAMPLE_INTERVAL_S * seq,
        ),
        AcceleratorSample(
            id="gpu0",
            utilization_pct=63.2,
            memory_used_bytes=2**33,
            power_w=51.7,
            temperature_c=61.0,
            energy_j=51.7 * SAMPLE_INTERVAL_S * seq,
        ),
    )
    return encode(
        Telemetry(
            node_id=node_id,
            instance_id="bench",
            seq=seq,
            # Encoded just before the run: well within the skew.
            sampled_at=time.time() if sampled_at is None else sampled_at,
            interval_s=SAMPLE_INTERVAL_S,
            cpu_utilization_pct=41.5,
            memory_used_bytes=2**34,
            memory_total_bytes=2**37,
            accelerators=samples,
        )
    )


def telemetry_messages(
    topics: Topics, nodes: int, rounds: int, *, spaced: bool = False, pace_s: float | None = None
) -> list[tuple[str, bytes]]:
    """Samples 1..`rounds` of `nodes` nodes with their topics, a round of every node's at
    a time. Each is stamped when it is made; with `spaced` an interval after the one
    before from now on (then no counter grows faster than its power, however fast the
    rounds are made: usage metering refuses a counter that does, cloud/usage/meter.py);
    with `pace_s` that many seconds after the one before, from now on: the pace at which
    a publisher will send them (round k about k · `pace_s` after it starts)."""
    ids = node_ids(nodes)
    start_s = time.time()
    step_s = SAMPLE_INTERVAL_S if spaced else pace_s
    return [
        (
            topics.node(node_id, Channel.TELEMETRY),
            telemetry(node_id, seq, None if step_s is None else start_s + seq * step_s),
        )
        for seq in range(1, rounds + 1)
        for node_id in ids
    ]


def publish(
    url: str,
    root: str,
    nodes: int,
    rate: int,
    seconds: float,
    go: multiprocessing.synchronize.Event,
    report: Queue[tuple[int, float]],
) -> None:
    """The publisher process: plain paho, pre-encoded payloads, paced in 10 ms ticks.
    Reports (messages sent, seconds it took to send them)."""
    import paho.mqtt.client as mqtt

    endpoint = parse_mqtt_url(url)
    topics = Topics(root)
    total = int(rate * seconds)
    per_node = -(-total // nodes)
    # Stamped at the pace they will be sent: with few nodes, samples stamped as they are
    # encoded (all within milliseconds) would have their counters outrun their power,
    # and a metering replica would refuse them (`usage_implausible`) and meter each one
    # by one, which no real fleet makes it do.
    payloads = telemetry_messages(topics, nodes, per_node, pace_s=nodes / rate)[:total]
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)  # type: ignore[attr-defined]
    client.max_queued_messages_set(0)
    if endpoint.username:  # a broker that requires a login: mqtt://user:password@host
        client.username_pw_set(endpoint.username, endpoint.password)
    client.connect(endpoint.host, endpoint.port)
    client.loop_start()
    go.wait()
    per_tick = rate * TICK_S
    started = time.perf_counter()
    sent = 0
    tick = 0
    while sent < total:
        tick += 1
        target = min(total, int(tick * per_tick))
        while sent < target:
            topic, payload = payloads[sent]
            client.publish(topic, payload, qos=0)
            sent += 1
        pause = started + tick * TICK_S - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    publish_s = time.perf_counter() - started
    time.sleep(0.5)
    client.loop_stop()
    client.disconnect()
    report.put((sent, publish_s))


@contextlib.asynccontextmanager
async def metering(
    ingestor: Ingestor, registry: NodeRegistry, nodes: int
) -> AsyncIterator[Accountant]:
    """The live accountant as the leader runs it, every node running one job on gpu0."""
    with tempfile.TemporaryDirectory(prefix="greenfed-bench-") as data_dir:
        store = await open_store(StoreSettings(data_dir=data_dir))
        lease = await store.try_acquire_leadership()
        assert lease is not None
        accountant = Accountant(store, registry, UsageSettings())
        # Read once per process (the shipped traces, about 0.4 s of CPU): a leader has
        # read them for its first pass long before it flushes usage, so they are read
        # here, before the run, not in its first flush (which, held to a twentieth of a
        # core, would stall the replica for seconds and count as metering).
        static_carbon_g_per_kwh()
        static_price_per_mwh()
        now = time.time()
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
                tenant_id="bench",
                work_kind="training",
                priority="p1",
            )
            for node_id in node_ids(nodes)
        )
        snapshot = StoreSnapshot(tenants=(), work=(), allocations=allocations, node_generations={})
        # Counted from a known start (every counter at 0 before the first sample), as a
        # leader that ran before would have it: what is metered is then the same
        # whichever replica hears a node's first sample.
        start = [
            UsageMark(node_id, "bench", 0, now, {"cpu0": 0.0, "gpu0": 0.0})
            for node_id in node_ids(nodes)
        ]
        await store.write_usage(UsageWrite(marks=start), lease=lease)
        accountant.note_pass(snapshot, GridSignals(now_s=now, zones={}))
        await accountant.begin(lease)
        accountant.note_pass(snapshot, GridSignals(now_s=now, zones={}))
        ingestor.telemetry_listeners.append(accountant.observe)
        flushing = asyncio.create_task(accountant.run(lease))
        try:
            yield accountant
        finally:
            flushing.cancel()
            await asyncio.gather(flushing, return_exceptions=True)
            await lease.release()
            await store.close()


async def run_rate(
    url: str, nodes: int, rate: int, seconds: float, *, accounting: bool = False
) -> dict[str, float | int]:
    async with contextlib.AsyncExitStack() as stack:
        result, accountant = await _run_rate(url, nodes, rate, seconds, accounting, stack)
    if accountant is not None:  # after its last flush
        result["usage_flushes"] = accountant.stats.flushes
        result["usage_rows_written"] = accountant.stats.rows_written
        # Device steps the meter refused (figures above what the devices can draw): 0 when
        # each node's samples come no faster than its interval, as they do here.
        result["usage_implausible"] = accountant.stats.implausible
        result["usage_last_flush_ms"] = round(accountant.stats.last_flush_ms, 1)
    return result


async def _run_rate(
    url: str,
    nodes: int,
    rate: int,
    seconds: float,
    accounting: bool,
    stack: contextlib.AsyncExitStack,
) -> tuple[dict[str, float | int], Accountant | None]:
    root = f"gfbench-{uuid.uuid4().hex[:8]}"
    settings = MqttSettings(url=url, topic_root=root)
    registry = NodeRegistry()
    ingestor = Ingestor(
        registry,
        Topics(root),
        max_payload_bytes=settings.max_payload_bytes,
        invalid_log_interval_s=60.0,
    )
    for node_id in node_ids(nodes):  # births straight into the registry: only telemetry is timed
        registry.apply_status(birth(node_id))
    accountant = (
        await stack.enter_async_context(metering(ingestor, registry, nodes)) if accounting else None
    )
    received = 0
    apply = ingestor.handle

    def counting_handle(topic: str, payload: bytes | bytearray) -> None:
        nonlocal received
        received += 1
        apply(topic, payload)

    ingestor.handle = counting_handle  # type: ignore[method-assign]
    session = ingestor.session(settings, client_id=f"bench-cloud-{uuid.uuid4().hex}")
    consumer = asyncio.create_task(ingestor.run(session))
    await asyncio.wait_for(ingestor.subscribed.wait(), 10)

    published, cpu, wall_s = await _drive_publisher(
        url, root, nodes, rate, seconds, lambda: received
    )
    sent = published.sent
    consumer.cancel()
    await asyncio.gather(consumer, return_exceptions=True)
    ingested = ingestor.stats.ingested["telemetry"]
    return {
        "rate_msgs_per_s": rate,
        **published.figures,
        "received": received,
        "ingested": ingested,
        "consumer_drops": received - ingested,
        "broker_losses": sent - received,
        **cpu.figures(ingested, wall_s),
    }, accountant


async def run_paho_rate(url: str, nodes: int, rate: int, seconds: float) -> dict[str, float | int]:
    """The same rig with a bare paho consumer: `on_message` counts, nothing else."""
    import paho.mqtt.client as mqtt

    root = f"gfbench-{uuid.uuid4().hex[:8]}"
    endpoint = parse_mqtt_url(url)
    received = 0

    def on_message(client: object, userdata: object, message: object) -> None:
        nonlocal received
        received += 1

    subscribed = asyncio.Event()
    loop = asyncio.get_running_loop()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"bench-paho-{root}")  # type: ignore[attr-defined]
    client.on_message = on_message

    def on_subscribe(*args: object) -> None:
        loop.call_soon_threadsafe(subscribed.set)

    client.on_subscribe = on_subscribe
    if endpoint.username:
        client.username_pw_set(endpoint.username, endpoint.password)
    client.connect(endpoint.host, endpoint.port)
    client.subscribe(Topics(root).all_nodes(Channel.TELEMETRY), qos=0)
    client.loop_start()
    await asyncio.wait_for(subscribed.wait(), 10)
    try:
        published, cpu, wall_s = await _drive_publisher(
            url, root, nodes, rate, seconds, lambda: received
        )
        sent = published.sent
    finally:
        client.loop_stop()
        client.disconnect()
    return {
        "rate_msgs_per_s": rate,
        **published.figures,
        "received": received,
        "ingested": received,
        "consumer_drops": 0,
        "broker_losses": sent - received,
        **cpu.figures(received, wall_s),
    }


@dataclasses.dataclass(frozen=True)
class Published:
    """What the publisher sent, and in how long: below the asked rate when the machine
    could not keep it (then every consumer was offered less)."""

    sent: int
    seconds: float

    @property
    def figures(self) -> dict[str, float | int]:
        return {"sent": self.sent, "published_per_s": round(self.sent / self.seconds)}


class CpuSpent:
    """This process's CPU time (every thread) since it was made: user and system."""

    def __init__(self) -> None:
        self._start = os.times()
        self.user_s = self.system_s = 0.0

    def stop(self) -> CpuSpent:
        now = os.times()
        self.user_s = now.user - self._start.user
        self.system_s = now.system - self._start.system
        return self

    @property
    def total_s(self) -> float:
        return self.user_s + self.system_s

    def figures(self, messages: int, wall_s: float) -> dict[str, float | int]:
        """The consumer's CPU (percent of one core; the kernel's part of it) and messages
        per CPU second."""
        return {
            "consumer_cpu_pct": round(100 * self.total_s / wall_s, 1),
            "consumer_system_cpu_pct": round(100 * self.system_s / wall_s, 1),
            "ingested_per_cpu_s": round(messages / self.total_s) if self.total_s > 0 else 0,
        }


async def _drive_publisher(
    url: str,
    root: str,
    nodes: int,
    rate: int,
    seconds: float,
    received: Callable[[], int],
) -> tuple[Published, CpuSpent, float]:
    """Run the publisher once the consumer listens; (what it sent, the consumer's CPU,
    wall s) once nothing new arrived for 1 s."""
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    report: Queue[tuple[int, float]] = context.Queue()
    publisher = context.Process(target=publish, args=(url, root, nodes, rate, seconds, go, report))
    publisher.start()
    await asyncio.sleep(3.0)  # the publisher pre-encodes its payloads before `go`
    cpu, wall_before = CpuSpent(), time.perf_counter()
    go.set()
    sent, publish_s = await asyncio.to_thread(report.get, True, seconds + 120)
    while True:  # everything in flight has arrived once nothing new came for 1 s
        before = received()
        await asyncio.sleep(1.0)
        if received() == before:
            break
    cpu.stop()
    wall_s = time.perf_counter() - wall_before - 1.0
    await asyncio.to_thread(publisher.join, 30)
    return Published(sent, publish_s), cpu, wall_s


def last_seqs(nodes: int, rate: int, seconds: float) -> dict[str, int]:
    """Each node's last sequence number the publisher sends (its payload order)."""
    total = int(rate * seconds)
    per_node = -(-total // nodes)
    return {
        node_id: per_node if (per_node - 1) * nodes + index < total else per_node - 1
        for index, node_id in enumerate(node_ids(nodes))
    }


def replica(
    url: str,
    root: str,
    nodes: int,
    index: int,
    accounting: bool,
    expected: dict[str, int],
    ready: Queue[int],
    go: multiprocessing.synchronize.Event,
    done: multiprocessing.synchronize.Event,
    report: Queue[dict[str, float | int]],
) -> None:
    """One control-plane replica's ingestion, in a process of its own."""
    logs_to_stderr()
    report.put(
        asyncio.run(_replica(url, root, nodes, index, accounting, expected, ready, go, done))
    )


async def _replica(
    url: str,
    root: str,
    nodes: int,
    index: int,
    accounting: bool,
    expected: dict[str, int],
    ready: Queue[int],
    go: multiprocessing.synchronize.Event,
    done: multiprocessing.synchronize.Event,
) -> dict[str, float | int]:
    settings = MqttSettings(url=url, topic_root=root, shared_group="bench")
    registry = NodeRegistry()
    ingestor = Ingestor(
        registry,
        Topics(root),
        max_payload_bytes=settings.max_payload_bytes,
        invalid_log_interval_s=60.0,
        shared_group=settings.shared_group,
        digest_interval_s=settings.digest_interval_s,
    )
    for node_id in node_ids(nodes):
        registry.apply_status(birth(node_id))
    async with contextlib.AsyncExitStack() as stack:
        accountant = None
        if accounting and index == 0:  # the leader meters
            accountant = await stack.enter_async_context(metering(ingestor, registry, nodes))
            ingestor.digest_listeners.append(accountant.observe)  # as cloud/app.py does
            ingestor.relayed_wanted = accountant.relayed
        received = 0
        apply = ingestor.handle
        digest_topic = Topics(root).telemetry_digest

        def counting_handle(topic: str, payload: bytes | bytearray) -> None:
            nonlocal received
            if topic != digest_topic:
                received += 1
            apply(topic, payload)

        ingestor.handle = counting_handle  # type: ignore[method-assign]
        session = ingestor.session(settings, client_id=f"bench-replica-{index}-{uuid.uuid4().hex}")
        consumer = asyncio.create_task(ingestor.run(session))
        reader = asyncio.create_task(read_figures(registry))
        await asyncio.wait_for(ingestor.subscribed.wait(), 10)
        ready.put(index)
        await asyncio.to_thread(go.wait)
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        await asyncio.to_thread(done.wait)
        # Settled: nothing new for 1 s, and every replica's last digest merged: every
        # node's last sample here, or nothing new for three such waits in a row (a
        # replica held to a share of a core, catching up on what queued for it while it
        # metered, may send its last digest seconds after the others went quiet).
        quiet = 0
        while True:
            before = (received, ingestor.stats.ingested[DIGEST_CHANNEL])
            await asyncio.sleep(1.0 + 2 * settings.digest_interval_s)
            if (received, ingestor.stats.ingested[DIGEST_CHANNEL]) != before:
                quiet = 0
                continue
            quiet += 1
            if quiet >= SETTLE_QUIET_WAITS or all(
                (record := registry.get(node_id)) is not None and record.telemetry_seq == seq
                for node_id, seq in expected.items()
            ):
                break
        cpu_s = time.process_time() - cpu_before
        wall_s = time.perf_counter() - wall_before
        consumer.cancel()
        reader.cancel()
        await asyncio.gather(consumer, reader, return_exceptions=True)
    ingested = ingestor.stats.ingested["telemetry"]
    current = sum(
        1
        for node_id, seq in expected.items()
        if (record := registry.get(node_id)) is not None
        and record.telemetry is not None
        and record.telemetry.seq == seq
    )
    result: dict[str, float | int] = {
        "replica": index,
        "received": received,
        "ingested": ingested,
        "merged": ingestor.stats.ingested[DIGEST_CHANNEL],
        "digest_stale": ingestor.stats.digest_stale,
        "consumer_drops": received - ingested,
        "invalid": ingestor.stats.invalid_total,
        "nodes_current": current,
        "cpu_s": round(cpu_s, 2),
        "cpu_pct": round(100 * cpu_s / wall_s, 1),
        "ingested_per_cpu_s": round(ingested / cpu_s) if cpu_s > 0 else 0,
    }
    if accountant is not None:
        result["usage_energy_j"] = round(sum(t.energy_j for t in accountant.totals.values()))
        result["usage_rows_written"] = accountant.stats.rows_written
        result["usage_replays"] = accountant.stats.replays
        result["usage_implausible"] = accountant.stats.implausible
    return result


async def read_figures(registry: NodeRegistry) -> None:
    """Every node's figures read every `READ_FIGURES_EVERY_S`, as a scrape reads them."""
    while True:
        await asyncio.sleep(READ_FIGURES_EVERY_S)
        for record in registry:
            _ = record.telemetry


async def run_replicas_rate(
    url: str,
    nodes: int,
    replicas: int,
    rate: int,
    seconds: float,
    *,
    accounting: bool,
    replica_cores: float | None = None,
) -> dict[str, object]:
    root = f"gfbench-{uuid.uuid4().hex[:8]}"
    with replica_cgroups(f"greenfed-bench-{root}", replicas, replica_cores) as procs_files:
        result = await _run_replicas_rate(
            url, root, nodes, replicas, rate, seconds, procs_files, accounting=accounting
        )
    return {"replicas": replicas, "replica_cores": replica_cores, **result}


def replica_period_us(cores: float) -> int:
    """The CFS period a replica's share is of: 10 ms, so that a throttled replica waits
    milliseconds between its turns (not the default period's tens; a socket's buffer
    holds what arrives meanwhile), longer under a tenth of a core, whose share of 10 ms
    would be under the kernel's least quota (1 ms)."""
    return max(10_000, math.ceil(1000 / cores))


@contextlib.contextmanager
def replica_cgroups(
    name: str, count: int, cores: float | None
) -> Iterator[list[tuple[str, ...]] | None]:
    """`count` cgroups holding a process each to `cores` of one core: the files a
    process joins them by (None: no quota). Removed after."""
    if cores is None:
        yield None
        return
    if not cores > 0:
        raise SystemExit(f"--replica-cores must be above 0, not {cores}")
    layout = discover_layout()
    if layout is None or "cpu" not in layout.controllers:
        raise SystemExit("--replica-cores: this host mounts no cgroup cpu controller")
    cgroups = WorkerCgroups(layout, name)
    limits = WorkerLimits(
        memory_bytes=None, cpu_cores=cores, pids=None, cpu_period_us=replica_period_us(cores)
    )
    try:
        cgroups.prepare_root(workers_memory_bytes=None)
        groups = cgroups.create_run("replicas", [limits] * count)
    except OSError as error:
        remove_groups(str(root) for root in cgroups.roots)
        raise SystemExit(f"--replica-cores needs root (or a delegated cgroup): {error}") from None
    try:
        yield [groups.procs_files(index) for index in range(count)]
    finally:
        remove_groups([*groups.all_dirs(), *(str(root) for root in cgroups.roots)])


async def _run_replicas_rate(
    url: str,
    root: str,
    nodes: int,
    replicas: int,
    rate: int,
    seconds: float,
    procs_files: list[tuple[str, ...]] | None,
    *,
    accounting: bool,
) -> dict[str, object]:
    context = multiprocessing.get_context("spawn")
    ready: Queue[int] = context.Queue()
    reports: Queue[dict[str, float | int]] = context.Queue()
    replica_go, done = context.Event(), context.Event()
    expected = last_seqs(nodes, rate, seconds)
    processes = [
        context.Process(
            target=replica,
            args=(url, root, nodes, index, accounting, expected, ready, replica_go, done, reports),
        )
        for index in range(replicas)
    ]
    for index, process in enumerate(processes):
        process.start()
        if procs_files is not None:  # as soon as it exists, while it starts its interpreter
            assert process.pid is not None
            join(procs_files[index], process.pid)
    for _ in processes:
        await asyncio.to_thread(ready.get, True, 60)
    go = context.Event()
    report: Queue[tuple[int, float]] = context.Queue()
    publisher = context.Process(target=publish, args=(url, root, nodes, rate, seconds, go, report))
    publisher.start()
    try:
        await asyncio.sleep(3.0)  # the publisher pre-encodes its payloads before `go`
        replica_go.set()
        go.set()
        sent, publish_s = await asyncio.to_thread(report.get, True, seconds + 120)
        published = Published(sent, publish_s)
        done.set()
        per_replica = [await asyncio.to_thread(reports.get, True, 120) for _ in processes]
    finally:
        replica_go.set()
        done.set()
        for process in [*processes, publisher]:
            await asyncio.to_thread(process.join, 30)
            if process.is_alive():
                process.terminate()
    per_replica.sort(key=lambda r: int(r["replica"]))
    received = sum(int(r["received"]) for r in per_replica)
    ingested = sum(int(r["ingested"]) for r in per_replica)
    cpu_s = sum(float(r["cpu_s"]) for r in per_replica)
    result: dict[str, object] = {
        "rate_msgs_per_s": rate,
        **published.figures,
        "received": received,
        "ingested": ingested,
        "consumer_drops": received - ingested,
        "broker_losses": sent - received,
        "every_replica_sees_every_node": all(int(r["nodes_current"]) == nodes for r in per_replica),
        "ingested_per_cpu_s": round(ingested / cpu_s) if cpu_s > 0 else 0,
        # The fleet's samples per CPU second of the busiest replica: the fleet rate N
        # replicas of one core each would take, by what they spent on this one. A
        # steadier figure than the knee of a sweep, read from a lossless rate.
        "fleet_samples_per_busiest_replica_cpu_s": round(sent / busiest_cpu_s)
        if (busiest_cpu_s := max(float(r["cpu_s"]) for r in per_replica)) > 0
        else 0,
        "per_replica": per_replica,
    }
    if accounting:
        result["usage_energy_j"] = per_replica[0].get("usage_energy_j")
    return result


def logs_to_stderr() -> None:
    """Log lines on stderr: stdout carries the JSON summary."""
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))


def main() -> None:
    logs_to_stderr()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mqtt-url", default="mqtt://127.0.0.1:1883")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rates", default="5000,10000,15000,20000")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--accounting", action="store_true", help="meter every sample (cloud/usage/)"
    )
    parser.add_argument("--consumer", choices=("greenfed", "paho"), default="greenfed")
    parser.add_argument(
        "--replicas", default="", help="e.g. 1,2,3: replicas sharing telemetry, one process each"
    )
    parser.add_argument(
        "--replica-cores",
        type=float,
        default=None,
        help="with --replicas: hold each replica to this share of one core (a CPU cgroup; "
        "root): N replicas get N times one replica's CPU, as N machines would",
    )
    args = parser.parse_args()
    rates = [int(rate) for rate in args.rates.split(",")]
    if args.replicas:
        sweeps = {
            replicas: [
                asyncio.run(
                    run_replicas_rate(
                        args.mqtt_url,
                        args.nodes,
                        replicas,
                        rate,
                        args.seconds,
                        accounting=args.accounting,
                        replica_cores=args.replica_cores,
                    )
                )
                for rate in rates
            ]
            for replicas in (int(count) for count in args.replicas.split(","))
        }
        json.dump(
            {
                "broker": args.mqtt_url,
                "nodes": args.nodes,
                "accounting": args.accounting,
                "replica_cores": args.replica_cores,
                "seconds_per_rate": args.seconds,
                "sweeps": {str(count): results for count, results in sweeps.items()},
                "highest_lossless_rate_msgs_per_s": {
                    str(count): max(
                        (int(str(r["rate_msgs_per_s"])) for r in results if _lossless(r)), default=0
                    )
                    for count, results in sweeps.items()
                },
            },
            sys.stdout,
            indent=2,
        )
        print()
        return
    if args.consumer == "paho":
        results = [
            asyncio.run(run_paho_rate(args.mqtt_url, args.nodes, rate, args.seconds))
            for rate in rates
        ]
    else:
        results = [
            asyncio.run(
                run_rate(args.mqtt_url, args.nodes, rate, args.seconds, accounting=args.accounting)
            )
            for rate in rates
        ]
    lossless = [r["rate_msgs_per_s"] for r in results if _lossless(r)]
    summary = {
        "broker": args.mqtt_url,
        "consumer": args.consumer,
        "nodes": args.nodes,
        "accounting": args.accounting,
        "seconds_per_rate": args.seconds,
        "results": results,
        "highest_lossless_rate_msgs_per_s": max(lossless, default=0),
        "total_consumer_drops": sum(int(r["consumer_drops"]) for r in results),
    }
    json.dump(summary, sys.stdout, indent=2)
    print()


def _lossless(result: Mapping[str, object]) -> bool:
    """Nothing dropped by the consumers or lost by the broker (and, with replicas, every
    replica's registry current for every node)."""
    return (
        result["consumer_drops"] == 0
        and result["broker_losses"] == 0
        and result.get("every_replica_sees_every_node", True) is True
    )


if __name__ == "__main__":
    main()
