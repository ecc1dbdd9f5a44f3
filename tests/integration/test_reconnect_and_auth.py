"""Broker restarts, refused credentials and TLS, against brokers the tests own."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiomqtt
import msgspec
import pytest

from cloud.fleet.liveness import Liveness, LivenessSettings
from greenfed.broker import EmbeddedBroker
from shared.errors import MqttAuthError
from shared.mqtt import MqttSession
from tests.support.brokers import (
    MosquittoProcess,
    free_port,
    make_password_file,
    make_tls_files,
)
from tests.support.fleet import mqtt_settings, running, running_ingestion, simulated_agent
from tests.support.waiting import eventually


async def test_agent_and_cloud_reconnect_and_reannounce_after_mosquitto_restarts(
    tmp_path: Path,
) -> None:
    mosquitto = MosquittoProcess(tmp_path)
    await mosquitto.start()
    try:
        settings = mqtt_settings(mosquitto.url, "restart")
        agent = simulated_agent("v100-1", settings, "v100-8x", site="cloud")
        async with running_ingestion(settings) as cloud, running(agent):
            await eventually(
                lambda: (r := cloud.registry.get("v100-1")) is not None and r.telemetry is not None
            )
            await mosquitto.stop()
            await eventually(
                lambda: agent.session is not None and not agent.session.connected.is_set()
            )
            # The broker comes back empty (no persistence): the agent's new birth restores it.
            await mosquitto.start()
            await eventually(lambda: agent.counters.births == 2, timeout_s=15)
            await eventually(lambda: cloud.session.connect_count >= 2, timeout_s=15)
            record = cloud.registry.get("v100-1")
            assert record is not None
            assert record.telemetry is not None
            seq_after_restart = record.telemetry.seq
            await eventually(
                lambda: record.telemetry is not None and record.telemetry.seq > seq_after_restart
            )
            assert record.state == "online"
    finally:
        await mosquitto.stop()


async def test_a_broker_outage_declares_no_node_offline_and_grants_a_fresh_grace(
    tmp_path: Path,
) -> None:
    """The control plane's own loss of the broker is no evidence about any node: through
    an outage (the broker killed: no wills) of many staleness deadlines the node stays
    online, and it is judged again only once the link is back (telemetry every 0.1 s:
    stale after 0.3 s)."""
    mosquitto = MosquittoProcess(tmp_path)
    await mosquitto.start()
    try:
        settings = mqtt_settings(mosquitto.url, "outage")
        agent = simulated_agent("a100-out", settings, "a100-4x", site="cloud")
        async with running_ingestion(settings) as cloud, running(agent):
            liveness = Liveness(
                cloud.registry,
                LivenessSettings(staleness_intervals=3.0, liveness_check_interval_s=0.05),
                link_up=cloud.ingestor.subscribed.is_set,
            )
            judged = asyncio.create_task(liveness.run(lambda: None))
            try:
                await eventually(
                    lambda: (
                        (r := cloud.registry.get("a100-out")) is not None
                        and r.telemetry is not None
                    )
                )
                await mosquitto.kill()
                await eventually(lambda: not cloud.ingestor.subscribed.is_set())
                outage_started = asyncio.get_running_loop().time()
                # Ten staleness deadlines with nothing heard from anyone.
                await eventually(
                    lambda: asyncio.get_running_loop().time() - outage_started > 3.0,
                    timeout_s=10,
                )
                record = cloud.registry.get("a100-out")
                assert record is not None
                assert (record.state, record.offline_reason) == ("online", None)
                assert liveness.lost_nodes(["a100-out"], {}) == {}  # not even unknown ones
                await mosquitto.start()
                await eventually(lambda: cloud.ingestor.subscribed.is_set(), timeout_s=15)
                seq = record.telemetry.seq if record.telemetry else -1
                await eventually(
                    lambda: record.telemetry is not None and record.telemetry.seq > seq,
                    timeout_s=15,
                )
                assert record.state == "online"
            finally:
                judged.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await judged
    finally:
        await mosquitto.stop()


async def test_agent_reconnects_after_the_embedded_broker_restarts() -> None:
    port = free_port()
    broker = EmbeddedBroker(port=port)
    await broker.start()
    try:
        settings = mqtt_settings(broker.url, "restart")
        agent = simulated_agent("orin-9", settings)
        async with running(agent):
            await eventually(lambda: agent.counters.births == 1)
            await broker.stop()
            await eventually(
                lambda: agent.session is not None and not agent.session.connected.is_set()
            )
            broker = EmbeddedBroker(port=port)
            await broker.start()
            async with running_ingestion(settings) as cloud:
                await eventually(lambda: agent.counters.births == 2, timeout_s=15)
                await eventually(
                    lambda: (
                        (r := cloud.registry.get("orin-9")) is not None
                        and r.state == "online"
                        and r.telemetry is not None
                    )
                )
    finally:
        await broker.stop()


async def test_refused_credentials_stop_the_agent_with_a_clear_error(tmp_path: Path) -> None:
    passwords = make_password_file(tmp_path, "agent", "right-secret")
    mosquitto = MosquittoProcess(tmp_path, password_file=passwords)
    await mosquitto.start()
    try:
        wrong = mqtt_settings(mosquitto.url, "auth", username="agent", password="wrong")
        agent = simulated_agent("locked-1", wrong)
        with pytest.raises(MqttAuthError, match="refused the credentials"):
            async with asyncio.timeout(10):
                await agent.run()
        assert agent.counters.births == 0
        # The right password works, given in the settings or in the URL.
        for settings in (
            mqtt_settings(mosquitto.url, "auth", username="agent", password="right-secret"),
            mqtt_settings(mosquitto.url.replace("mqtt://", "mqtt://agent:right-secret@"), "auth"),
        ):
            async with (
                running_ingestion(settings) as cloud,
                running(simulated_agent("locked-1", settings)),
            ):
                await eventually(lambda: cloud.registry.get("locked-1") is not None)
    finally:
        await mosquitto.stop()


async def test_agent_and_cloud_talk_over_tls_with_a_private_ca(tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path)
    mosquitto = MosquittoProcess(tmp_path, tls=tls)
    await mosquitto.start()
    try:
        settings = mqtt_settings(mosquitto.url, "tls", tls_ca_file=str(tls.ca_cert))
        assert settings.url.startswith("mqtts://")
        async with (
            running_ingestion(settings) as cloud,
            running(simulated_agent("tls-1", settings)),
        ):
            await eventually(
                lambda: (r := cloud.registry.get("tls-1")) is not None and r.telemetry is not None
            )
        # Without the CA the certificate is not trusted, so the connection never succeeds.
        untrusted = mqtt_settings(mosquitto.url, "tls")
        agent = simulated_agent("tls-2", untrusted)
        async with running(agent):
            await eventually(
                lambda: agent.session is not None and agent.session.failed_attempts >= 2
            )
            assert agent.counters.births == 0
    finally:
        await mosquitto.stop()


async def test_a_session_takes_up_new_credentials_when_the_broker_refuses_the_old(
    tmp_path: Path,
) -> None:
    """A node enrolled again gets a new password in its settings file; its session, once
    connected, reads it when the broker refuses the old one, instead of ending (and the
    agent's work with it). A session never connected still stops with a clear error."""
    passwords = make_password_file(tmp_path, "edge-1", "first-secret")
    mosquitto = MosquittoProcess(tmp_path, password_file=passwords)
    await mosquitto.start()
    current = {"password": "first-secret"}
    try:
        settings = mqtt_settings(
            mosquitto.url, "rotate", username="edge-1", password="first-secret"
        )
        session = MqttSession(settings, client_id="rotate-edge-1")
        session.reload_settings = lambda: msgspec.structs.replace(
            settings, password=current["password"]
        )

        async def body(client: aiomqtt.Client) -> None:
            async for _ in client.messages:  # until the link drops
                pass

        runner = asyncio.create_task(session.run(body))
        try:
            await eventually(lambda: session.connect_count == 1)
            await mosquitto.stop()
            make_password_file(tmp_path, "edge-1", "second-secret")
            await mosquitto.start()
            await eventually(lambda: session.refused_credentials >= 2, timeout_s=30)
            assert not runner.done()  # refused, but not ended: it waits for new credentials
            current["password"] = "second-secret"
            await eventually(lambda: session.connect_count == 2, timeout_s=30)
            assert session.connected.is_set()
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        fresh = MqttSession(settings, client_id="rotate-edge-2")
        fresh.reload_settings = session.reload_settings
        current["password"] = "first-secret"
        with pytest.raises(MqttAuthError, match="refused the credentials"):
            async with asyncio.timeout(10):
                await fresh.run(body)
    finally:
        await mosquitto.stop()
