"""50,000 random and malformed messages on every channel against a running control
plane and enrolled fleet on a Mosquitto with per-node accounts: without credentials
the attacker cannot even connect; with a node's valid credentials (an enrolled
intruder) it aims at every node and every channel. Nothing crashes, no request
answers 5xx afterwards, every real node stays online and takes work, nothing forged
runs, memory stays bounded."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import aiomqtt
import psutil
import pytest
from aiomqtt.exceptions import MqttError

from cloud.app_keys import INGESTOR
from cloud.broker_accounts.dynsec_protocol import node_client_id
from cloud.fleet.ingest import DECODERS
from shared.settings import parse_mqtt_url
from shared.topics import TopicError
from tests.api.support import bearer
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import reaches
from tests.support.enrolled_fleet import enrolled_fleet
from tests.support.mqtt_fuzz import messages
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(240)

FUZZ_MESSAGES = 50_000
INTRUDER = "intruder-0"
# Growth allowed over the run: the registry is bounded by cloud.max_nodes and every
# per-node structure by the registry; what is left is allocator noise.
RSS_GROWTH_LIMIT_BYTES = 150 * 2**20


def job(name: str) -> dict[str, object]:
    return {"name": name, "command": ["python", "t.py"], "estimated_duration_s": 0.5}


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)  # the broker edge, not the store
async def test_fuzzing_every_channel_crashes_nothing_and_disturbs_no_real_node(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    async with enrolled_fleet(database, tmp_path, extra_accounts=(INTRUDER,)) as running:
        api = running.api
        token = await api.tenant("acme")
        before_work = await api.submitted(token, job("before"))
        await reaches(api, token, before_work, "succeeded")
        ingestor = api.app[INGESTOR]
        endpoint = parse_mqtt_url(running.broker.url)

        # Without credentials, or with a wrong password, there is no connection at all.
        for username, password in ((None, None), (INTRUDER, "wrong"), ("a100-0", "guess")):
            with pytest.raises(MqttError):
                async with aiomqtt.Client(
                    endpoint.host, endpoint.port, username=username, password=password
                ):
                    pass

        real_nodes = ("a100-0", "a100-1")
        intruder = running.nodes[INTRUDER].mqtt
        rss_before = psutil.Process(os.getpid()).memory_info().rss

        def counted() -> int:
            """Messages ingestion has applied or refused so far."""
            return sum(ingestor.stats.ingested.values()) + ingestor.stats.invalid_total

        counted_before = counted()
        own_topics = 0  # what the broker lets through: the intruder's own channels
        async with aiomqtt.Client(
            endpoint.host,
            endpoint.port,
            # The one client id the intruder's account may connect with (its agent's).
            identifier=node_client_id(running.topics, INTRUDER),
            username=intruder.username,
            password=intruder.password,
            max_queued_outgoing_messages=0,
        ) as attacker:
            for index, (topic, payload) in enumerate(
                messages(running.topics, (*real_nodes, INTRUDER), FUZZ_MESSAGES, seed=12)
            ):
                try:
                    parsed = running.topics.parse(topic)
                except TopicError:
                    parsed = None
                if parsed is not None and parsed.node_id == INTRUDER:
                    own_topics += parsed.channel in DECODERS
                # Every 50th at QoS 1: the broker has each batch before the next one.
                await attacker.publish(topic, payload, qos=1 if index % 50 == 0 else 0)

        await eventually(
            lambda: counted() - counted_before >= own_topics,
            timeout_s=120,
            message=lambda: f"{counted() - counted_before} of {own_topics} counted",
        )
        assert ingestor.stats.failures == 0  # no handler raised
        # Nothing reached the control plane on another node's behalf: only the
        # intruder's own topics and the real nodes' genuine traffic were counted.
        assert ingestor.stats.invalid_total > own_topics // 2

        # Every real node is still online and still takes work.
        assert {n: s for n, s in running.states().items() if n in real_nodes} == {
            "a100-0": "online",
            "a100-1": "online",
        }
        after_work = await api.submitted(token, job("after"))
        await reaches(api, token, after_work, "succeeded")
        # Forged desired documents started nothing anywhere.
        started = {
            spec.job_id for node in running.nodes.values() for spec, _, _ in node.launcher.runs
        }
        assert started <= {before_work, after_work}
        # No request answers 5xx, for the admin or a tenant.
        for who in (api.admin_token, token):
            for path in ("/v1/nodes", "/v1/jobs", "/v1/deployments", "/metrics"):
                response = await api.client.get(path, headers=bearer(who))
                assert response.status < 500, (path, response.status, await response.text())
                response.release()
        rss_growth = psutil.Process(os.getpid()).memory_info().rss - rss_before
        assert rss_growth < RSS_GROWTH_LIMIT_BYTES, f"RSS grew {rss_growth / 2**20:.0f} MiB"
        reasons: Counter[str] = Counter()
        for (_, reason), count in ingestor.stats.invalid.items():
            reasons[reason] += count
        # The figures benchmarks/RESULTS.md records (pytest -rA shows them).
        print(f"fuzz: {FUZZ_MESSAGES} sent, {own_topics} past the broker ACL")
        print(f"fuzz: refused by reason {dict(reasons.most_common())}")
        print(f"fuzz: RSS growth {rss_growth / 2**20:.1f} MiB")
