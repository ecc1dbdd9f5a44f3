"""What re-admission after a store lost without a backup costs (issue 25).

- **Births of nodes not enrolled**, per second through ingestion (`Ingestor.handle`):
  plain births (refused and counted, as before), births proving an enrolment
  certificate seen for the first time (signature, X25519 agreement and HMAC checked,
  the node remembered), and the same births again (a retained birth re-delivered, a
  reconnect): what a fleet knocking at a control plane that lost its store costs it.
- **Re-admission**: the real app over HTTP on SQLite (and PostgreSQL with `--postgres`),
  `--nodes` nodes knocking; the time of `POST /v1/nodes/readmit {"all": true}` until
  every node is enrolled again, audited, and online in the registry.

    python benchmarks/readmission_bench.py --nodes 1000 --runs 5 \\
        [--postgres postgresql+asyncpg://postgres@127.0.0.1:5432/test]

Medians over `--runs`, each figure printed as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cloud.api.enrolment import ENROLMENT_STATE
from cloud.app import create_app
from cloud.app_keys import INGESTOR, REGISTRY
from cloud.fleet.certificates import CertificateAuthority
from cloud.fleet.envelope import NodeEnvelope
from cloud.fleet.ingest import Ingestor
from cloud.fleet.registry import NodeRegistry
from cloud.fleet.unenrolled import UnenrolledNodes
from edge.enrolment_proof import EnrolmentProof
from shared.messages import HostInfo, NodeStatus, encode
from shared.sealing import public_key_text
from shared.settings import CloudSettings, MqttSettings, SchedulingSettings, Settings, StoreSettings
from shared.token_files import admin_token_path, read_token_file
from shared.topics import Channel, Topics

TOPICS = Topics("readmitbench")
ENVELOPE = NodeEnvelope(site="edge", zone="DE", region="europe-west3")


def birth(node_id: str) -> NodeStatus:
    now = time.time()
    return NodeStatus(
        node_id=node_id,
        state="online",
        instance_id=uuid.uuid4().hex,
        agent_version="bench",
        site="edge",
        zone="DE",
        region="europe-west3",
        host=HostInfo(
            hostname=node_id, os="Linux", arch="x86_64", cpu_logical_cores=8, memory_total_bytes=1
        ),
        accelerators=(),
        telemetry_interval_s=5.0,
        started_at=now,
        sent_at=now,
        runs_training=False,
    )


def proving_births(authority: CertificateAuthority, nodes: int) -> list[tuple[str, bytes]]:
    """(topic, payload) of one proving birth per node, as its agent would publish it."""
    found = []
    for index in range(nodes):
        node_id = f"edge-{index}"
        key = X25519PrivateKey.generate()
        certificate = authority.issue(
            cluster_id="lost",
            node_id=node_id,
            sealing_public_key=public_key_text(key),
            envelope=ENVELOPE,
            enrolled_at=time.time(),
            join_token_id="jt",
            username=node_id,
        )
        status = birth(node_id)
        status = msgspec.structs.replace(
            status,
            sealing_public_key=public_key_text(key),
            enrolment_certificate=certificate,
            identity_proof=EnrolmentProof(certificate, key).proof(status.instance_id),
        )
        found.append((TOPICS.node(node_id, Channel.STATUS), encode(status)))
    return found


def per_s(messages: list[tuple[str, bytes]], ingestor: Ingestor) -> float:
    started = time.perf_counter()
    for topic, payload in messages:
        ingestor.handle(topic, payload)
    return len(messages) / (time.perf_counter() - started)


def knocking_rates(nodes: int) -> dict[str, float]:
    authority = CertificateAuthority(Ed25519PrivateKey.generate())
    knocking = UnenrolledNodes(time.time, capacity=nodes, log_interval_s=3600)
    knocking.authority = authority
    ingestor = Ingestor(NodeRegistry(max_nodes=nodes), TOPICS, max_payload_bytes=1 << 20)
    ingestor.admits_node = lambda node_id: False
    ingestor.unenrolled_birth = knocking.offer
    plain = [
        (TOPICS.node(f"edge-{index}", Channel.STATUS), encode(birth(f"edge-{index}")))
        for index in range(nodes)
    ]
    proving = proving_births(authority, nodes)
    rates = {
        "plain": per_s(plain, ingestor),
        "proving_first_seen": per_s(proving, ingestor),
        "proving_again": per_s(proving, ingestor),
    }
    assert len(knocking.listing()) == nodes
    return rates


async def until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    started = time.perf_counter()
    while not condition():
        if time.perf_counter() - started > timeout_s:
            raise TimeoutError("the condition never held")
        await asyncio.sleep(0.001)


async def readmission_s(nodes: int, store: StoreSettings) -> float:
    settings = Settings(
        # No broker: births are fed to ingestion directly; the session retries unseen.
        mqtt=MqttSettings(url="mqtt://127.0.0.1:9", topic_root=TOPICS.root),
        cloud=CloudSettings(require_enrolment=True, broker_accounts="none", max_nodes=nodes + 1),
        store=store,
        scheduling=SchedulingSettings(enabled=False),
    )
    app = create_app(settings)
    async with TestClient(TestServer(app)) as client:
        headers = {"Authorization": f"Bearer {read_token_file(admin_token_path(store))}"}
        authority = app[ENROLMENT_STATE].authority
        assert authority is not None
        for topic, payload in proving_births(authority, nodes):
            app[INGESTOR].handle(topic, payload)
        registry = app[REGISTRY]
        assert len(app[ENROLMENT_STATE].unenrolled.listing()) == nodes
        started = time.perf_counter()
        response = await client.post("/v1/nodes/readmit", json={"all": True}, headers=headers)
        assert response.status == 200, await response.text()
        await until(lambda: sum(r.state == "online" for r in registry.nodes()) == nodes)
        elapsed_s = time.perf_counter() - started
        assert len((await response.json())["readmitted"]) == nodes
    return elapsed_s


async def postgres_store(url: str, data_dir: str) -> StoreSettings:
    """A schema of its own in the given database, dropped by the caller."""
    schema = f"readmitbench_{uuid.uuid4().hex[:8]}"
    return StoreSettings(data_dir=data_dir, database_url=url, database_schema=schema)


async def drop_schema(store: StoreSettings) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(store.database_url)
    async with engine.begin() as connection:
        await connection.execute(text(f'DROP SCHEMA IF EXISTS "{store.database_schema}" CASCADE'))
    await engine.dispose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--postgres", help="an asyncpg URL to measure PostgreSQL too")
    args = parser.parse_args()
    rates = [knocking_rates(args.nodes) for _ in range(args.runs)]
    print(
        json.dumps(
            {
                f"births_per_s_{kind}": round(statistics.median(r[kind] for r in rates))
                for kind in rates[0]
            }
            | {"nodes": args.nodes}
        )
    )
    results: dict[str, Any] = {"nodes": args.nodes, "runs": args.runs}
    sqlite_s = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as directory:
            sqlite_s.append(await readmission_s(args.nodes, StoreSettings(data_dir=directory)))
    results["readmit_all_sqlite_ms"] = round(1000 * statistics.median(sqlite_s))
    if args.postgres:
        postgres_s = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as directory:
                store = await postgres_store(args.postgres, directory)
                try:
                    postgres_s.append(await readmission_s(args.nodes, store))
                finally:
                    await drop_schema(store)
        results["readmit_all_postgresql_ms"] = round(1000 * statistics.median(postgres_s))
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
