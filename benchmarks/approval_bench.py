"""What holding nodes to what they enrolled as costs, and how fast an approval acts.

- **Births judged**: births per second the registry applies for a fleet of enrolled
  nodes (8 GPUs each, an envelope with a ceiling and a first claim each), against the
  same births with nothing to hold them to: what the check adds to ingestion.
- **Approval latency**: two control planes (replicas) on one SQLite store, the real
  app over HTTP. A node enrolled as an edge node announces itself as a cloud node with
  more GPUs than approved; the time from `POST /v1/nodes/{id}/approve` on the first
  replica until the node is approved on the first (the replica that acted) and on
  the second (which learns it from the store), and until the first replica's next
  scheduling pass could place work there.

    python benchmarks/approval_bench.py --nodes 2000 --runs 5

Medians over `--runs`, each figure printed as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from cloud.app import create_app
from cloud.app_keys import INGESTOR, REGISTRY
from cloud.fleet.envelope import NodeEnvelope, claim_of
from cloud.fleet.registry import NodeRecord, NodeRegistry
from cloud.loop.nodes import scheduler_node
from cloud.store import NodeAdminRecord
from shared.messages import Accelerator, HostInfo, NodeStatus, Site, encode
from shared.settings import (
    CloudSettings,
    MqttSettings,
    SchedulingSettings,
    Settings,
    StoreSettings,
)
from shared.token_files import admin_token_path, read_token_file
from shared.topics import Channel, Topics

GIB = 1024**3
TOPIC_ROOT = "approvalbench"


def birth(node_id: str, *, gpus: int, site: Site = "edge", instance: str = "i1") -> NodeStatus:
    now = time.time()
    return NodeStatus(
        node_id=node_id,
        state="online",
        instance_id=instance,
        agent_version="bench",
        site=site,
        zone="DE",
        region="europe-west3",
        host=HostInfo(
            hostname=node_id,
            os="Linux",
            arch="x86_64",
            cpu_logical_cores=64,
            memory_total_bytes=GIB,
        ),
        accelerators=tuple(
            Accelerator(
                id=f"gpu{index}",
                kind="gpu",
                vendor="nvidia",
                model="NVIDIA H100 80GB HBM3",
                memory_bytes=80 * GIB,
                compute_units=132,
            )
            for index in range(gpus)
        ),
        telemetry_interval_s=5.0,
        started_at=now,
        sent_at=now,
        runs_training=True,
    )


def births_per_s(nodes: int, held: bool) -> float:
    """Apply one birth per node to a registry that already knows them (a fleet's
    reconnect), with or without envelopes and first claims to hold them to."""
    registry = NodeRegistry(max_nodes=nodes + 1)
    statuses = [birth(f"n{index}", gpus=8) for index in range(nodes)]
    if held:
        envelope = NodeEnvelope(
            site="edge", zone="DE", max_accelerators={"gpu": 8, "cpu": 2}, work="any"
        )
        registry.envelope_of = lambda node_id: envelope
        registry.set_admin(
            {s.node_id: NodeAdminRecord(node_id=s.node_id, approved=claim_of(s)) for s in statuses}
        )
    for status in statuses:
        registry.apply_status(status)
    again = [msgspec.structs.replace(s, instance_id="i2") for s in statuses]
    started = time.perf_counter()
    for status in again:
        registry.apply_status(status)
    elapsed_s = time.perf_counter() - started
    assert all(not record.awaiting_approval for record in registry)
    scheduler_node(next(iter(registry)))  # the believed figures are ready for a pass
    return nodes / elapsed_s


@asynccontextmanager
async def replica(store: StoreSettings) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    settings = Settings(
        # No broker: births are fed to ingestion directly; the session retries unseen.
        mqtt=MqttSettings(url="mqtt://127.0.0.1:9", topic_root=TOPIC_ROOT),
        cloud=CloudSettings(require_enrolment=True, broker_accounts="none"),
        store=store,
        scheduling=SchedulingSettings(enabled=False),
    )
    async with TestClient(TestServer(create_app(settings))) as client:
        yield client


async def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> float:
    """Seconds until `condition()` holds (polled every millisecond)."""
    started = time.perf_counter()
    while not condition():
        if time.perf_counter() - started > timeout_s:
            raise TimeoutError("the condition never held")
        await asyncio.sleep(0.001)
    return time.perf_counter() - started


def _enrolled(registry: NodeRegistry, node_id: str) -> bool:
    return registry.envelope_of(node_id) is not None


def _approved(record: NodeRecord) -> bool:
    return record.approval == "approved"


async def approval_latency(runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        store = StoreSettings(data_dir=directory)
        async with replica(store) as first, replica(store) as second:
            admin = read_token_file(admin_token_path(store))
            headers = {"Authorization": f"Bearer {admin}"}
            local_s, remote_s = [], []
            for run in range(runs):
                node_id = f"edge-{run}"
                response = await first.post(
                    "/v1/nodes/join-tokens", json={"site": "edge"}, headers=headers
                )
                token = (await response.json())["token"]
                response = await first.post(
                    "/v1/nodes/enrol", json={"token": token, "node_id": node_id}
                )
                assert response.status == 200, await response.text()
                topic = Topics(TOPIC_ROOT).node(node_id, Channel.STATUS)
                lying = encode(birth(node_id, gpus=64, site="cloud"))
                for app in (first.app, second.app):
                    registry = app[REGISTRY]
                    await until(functools.partial(_enrolled, registry, node_id))
                    app[INGESTOR].handle(topic, lying)
                    record = registry.get(node_id)
                    assert record is not None
                    assert record.approval == "pending-approval"
                started = time.perf_counter()
                response = await first.post(f"/v1/nodes/{node_id}/approve", headers=headers)
                assert response.status == 200, await response.text()
                local_s.append(time.perf_counter() - started)
                record = second.app[REGISTRY].get(node_id)
                assert record is not None
                remote_s.append(
                    time.perf_counter()
                    - started
                    + await until(functools.partial(_approved, record))
                )
    return {
        "approved_on_the_acting_replica_ms": round(1000 * statistics.median(local_s), 1),
        "approved_on_another_replica_ms": round(1000 * statistics.median(remote_s), 1),
        "runs": runs,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    held = [births_per_s(args.nodes, held=True) for _ in range(args.runs)]
    free = [births_per_s(args.nodes, held=False) for _ in range(args.runs)]
    print(
        json.dumps(
            {
                "births_per_s_held": round(statistics.median(held)),
                "births_per_s_not_held": round(statistics.median(free)),
                "held_over_not_held": round(statistics.median(held) / statistics.median(free), 2),
                "nodes": args.nodes,
            }
        )
    )
    print(json.dumps(await approval_latency(args.runs)))


if __name__ == "__main__":
    asyncio.run(main())
