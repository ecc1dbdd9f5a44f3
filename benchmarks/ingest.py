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

    python benchmarks/ingest.py --mqtt-url mqtt://127.0.0.1:1883 --rates 5000,10000,15000,20000
    python benchmarks/ingest.py --accounting --rates 10000,15000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import multiprocessing.synchronize
import random
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from multiprocessing.queues import Queue
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cloud.fleet.ingest import Ingestor
from cloud.fleet.registry import NodeRegistry
from cloud.signals.grid import GridSignals
from cloud.store import AllocationRecord, StoreSnapshot, open_store
from cloud.usage.accountant import Accountant
from shared.messages import AcceleratorSample, NodeStatus, Telemetry, encode
from shared.settings import MqttSettings, StoreSettings, UsageSettings, parse_mqtt_url
from shared.topics import Channel, Topics
from sim_devices.probes import SimulatedNode
from sim_devices.profiles import get_profile

TICK_S = 0.01
SAMPLE_INTERVAL_S = 0.05


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


def telemetry(node_id: str, seq: int) -> bytes:
    """A realistic 2-accelerator sample (about 500 bytes)."""
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
            sampled_at=time.time(),  # encoded just before the run: well within the skew
            interval_s=SAMPLE_INTERVAL_S,
            cpu_utilization_pct=41.5,
            memory_used_bytes=2**34,
            memory_total_bytes=2**37,
            accelerators=samples,
        )
    )


def publish(
    url: str,
    root: str,
    nodes: int,
    rate: int,
    seconds: float,
    go: multiprocessing.synchronize.Event,
    report: Queue[int],
) -> None:
    """The publisher process: plain paho, pre-encoded payloads, paced in 10 ms ticks."""
    import paho.mqtt.client as mqtt

    endpoint = parse_mqtt_url(url)
    topics = Topics(root)
    ids = node_ids(nodes)
    total = int(rate * seconds)
    per_node = -(-total // nodes)
    payloads = [
        (topics.node(node_id, Channel.TELEMETRY), telemetry(node_id, seq))
        for seq in range(1, per_node + 1)
        for node_id in ids
    ][:total]
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
    time.sleep(0.5)
    client.loop_stop()
    client.disconnect()
    report.put(sent)


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

    context = multiprocessing.get_context("spawn")
    go = context.Event()
    report: Queue[int] = context.Queue()
    publisher = context.Process(target=publish, args=(url, root, nodes, rate, seconds, go, report))
    publisher.start()
    await asyncio.sleep(3.0)  # the publisher pre-encodes its payloads before `go`
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    go.set()
    sent = await asyncio.to_thread(report.get, True, seconds + 120)
    while True:  # everything in flight has arrived once nothing new came for 1 s
        before = received
        await asyncio.sleep(1.0)
        if received == before:
            break
    cpu_s = time.process_time() - cpu_before
    wall_s = time.perf_counter() - wall_before - 1.0
    await asyncio.to_thread(publisher.join, 30)
    consumer.cancel()
    await asyncio.gather(consumer, return_exceptions=True)
    ingested = ingestor.stats.ingested["telemetry"]
    return {
        "rate_msgs_per_s": rate,
        "sent": sent,
        "received": received,
        "ingested": ingested,
        "consumer_drops": received - ingested,
        "broker_losses": sent - received,
        "consumer_cpu_pct": round(100 * cpu_s / wall_s, 1),
        "ingested_per_cpu_s": round(ingested / cpu_s) if cpu_s > 0 else 0,
    }, accountant


def main() -> None:
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
    args = parser.parse_args()
    results = [
        asyncio.run(
            run_rate(args.mqtt_url, args.nodes, int(rate), args.seconds, accounting=args.accounting)
        )
        for rate in args.rates.split(",")
    ]
    lossless = [
        r["rate_msgs_per_s"]
        for r in results
        if r["consumer_drops"] == 0 and r["broker_losses"] == 0
    ]
    summary = {
        "broker": args.mqtt_url,
        "nodes": args.nodes,
        "accounting": args.accounting,
        "seconds_per_rate": args.seconds,
        "results": results,
        "highest_lossless_rate_msgs_per_s": max(lossless, default=0),
        "total_consumer_drops": sum(int(r["consumer_drops"]) for r in results),
    }
    json.dump(summary, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
