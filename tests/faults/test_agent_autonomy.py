"""Agents that keep working alone (issue 15), on the real Mosquitto: an agent restarted
while its broker is unreachable serves its deployments again from its state directory,
reconciles by generation once the broker is back (restarting nothing still wanted, and
withdrawing what was cancelled meanwhile), and events and job logs raised during a
partition arrive in order, none lost, none twice once deduplicated as the cloud does.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from edge.agent import Agent
from edge.inference.options import InferenceOptions
from edge.training.process import LOST_REASON, read_started
from edge.training.worker_record import WorkerRecord, is_alive, load_record
from shared.messages import DesiredState, DesiredTraining
from shared.settings import MqttSettings, parse_mqtt_url
from tests.api.support import Api, bearer
from tests.store.databases import DatabaseUnderTest
from tests.support.brokers import BrokerUnderTest
from tests.support.control_plane import Fleet, fleet, reaches, work
from tests.support.fleet import (
    mqtt_settings,
    publish_desired,
    running,
    running_ingestion,
    simulated_agent,
)
from tests.support.launchers import plain_launchers
from tests.support.onnx_models import mlp_reference
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import eventually, eventually_async

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

X = np.array([[1.0, -2.0, 0.5, 3.0]], np.float32)
# The bound: a restarted agent serves its deployments again within this long.
RESTORE_BOUND_S = 5.0


async def deployed(api: Api, token: str) -> str:
    model_id = await api.model(token)
    spec = {"name": "mlp", "model_id": model_id, "replicas": 1}
    deployment_id = await api.submitted(token, spec, collection="deployments")
    await reaches(api, token, deployment_id, "running", collection="deployments")
    return deployment_id


async def answers(agent: Agent, deployment_id: str) -> int | None:
    """The status of one inference request to the agent's endpoint (None: no endpoint)."""
    if agent.inference_port is None:
        return None
    url = f"http://127.0.0.1:{agent.inference_port}/v1/infer/{deployment_id}"
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, json={"inputs": {"x": X.tolist()}}) as answer,
    ):
        if answer.status == 200:
            body = await answer.json()
            np.testing.assert_allclose(body["outputs"]["y"], mlp_reference(X), rtol=1e-5)
        return answer.status


async def restart_offline(
    running: Fleet, node_id: str, state_root: Path, mosquitto_root: tuple[str, str]
) -> tuple[Agent, TcpProxy]:
    """Stop the node's agent and start a new one whose broker is unreachable: a proxy in
    front of the real broker that refuses every connection until told otherwise."""
    await running.stop_agent(node_id)
    url, topic_root = mosquitto_root
    endpoint = parse_mqtt_url(url)
    proxy = TcpProxy(endpoint.host, endpoint.port)
    await proxy.start()
    await proxy.unplug()
    assert running.cache_root is not None
    agent = simulated_agent(
        node_id,
        mqtt_settings(proxy.url, topic_root),
        telemetry_interval_s=0.2,
        inference=InferenceOptions(cache_dir=running.cache_root / node_id),
        control_plane_public_key=running.public_key,
        state_dir=state_root / node_id,
    )
    running.agents[node_id] = agent
    running.tasks[node_id] = asyncio.create_task(agent.run(), name=node_id)
    return agent, proxy


async def test_a_restarted_agent_serves_from_disk_without_its_broker_and_reconciles(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str], tmp_path: Path
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=1, state_root=tmp_path) as running:
        api = running.api
        token = await api.tenant("vision")
        deployment_id = await deployed(api, token)
        started = time.monotonic()
        agent, proxy = await restart_offline(running, "orin-0", tmp_path, mosquitto_root)
        try:
            await eventually_async(
                lambda: _serves(agent, deployment_id),
                timeout_s=RESTORE_BOUND_S,
                message="the restarted agent does not serve its deployment",
            )
            restore_s = time.monotonic() - started
            assert agent.session is not None
            assert not agent.session.connected.is_set()  # all of it without the broker
            assert agent.counters.desired_restored == 1
            runtime = agent.inference
            assert runtime is not None
            serving = runtime.serving(deployment_id)
            assert serving is not None
            batcher = serving.batcher
            print(f"restored and serving {restore_s:.2f} s after the restart")

            # Back online: the retained document has the same generation, so nothing is
            # loaded again, and the cloud sees the replica ready from the new instance.
            await proxy.plug()
            await eventually(agent.session.connected.is_set, timeout_s=10)
            await eventually(lambda: agent.counters.desired_received >= 1, timeout_s=10)
            await reaches(api, token, deployment_id, "running", collection="deployments")
            states = (await work(api, token, deployment_id, "deployments"))["replica_states"]
            assert [s["state"] for s in states] == ["ready"]
            assert runtime.serving(deployment_id) is serving
            assert serving.batcher is batcher
            assert runtime.swaps == 0
            assert await answers(agent, deployment_id) == 200
        finally:
            await proxy.stop()


async def test_work_cancelled_while_the_agent_was_alone_is_withdrawn_on_reconnect(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str], tmp_path: Path
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=1, state_root=tmp_path) as running:
        api = running.api
        token = await api.tenant("vision")
        deployment_id = await deployed(api, token)
        agent, proxy = await restart_offline(running, "orin-0", tmp_path, mosquitto_root)
        try:
            await eventually_async(lambda: _serves(agent, deployment_id), timeout_s=10)
            # The control plane cancels it while the node is unreachable.
            response = await api.client.delete(
                f"/v1/deployments/{deployment_id}", headers=bearer(token)
            )
            assert response.status == 200, await response.text()
            await reaches(api, token, deployment_id, "cancelled", collection="deployments")
            assert await answers(agent, deployment_id) == 200  # alone, it keeps serving
            await proxy.plug()
            await eventually_async(
                lambda: _answers_is(agent, deployment_id, (404, 503)),
                timeout_s=10,
                message="the cancelled deployment is still served after reconnecting",
            )
        finally:
            await proxy.stop()


async def test_events_and_job_logs_raised_during_a_partition_arrive_in_order(
    broker: BrokerUnderTest, topic_root: str, tmp_path: Path
) -> None:
    endpoint = parse_mqtt_url(broker.url)
    proxy = TcpProxy(endpoint.host, endpoint.port)
    await proxy.start()
    lines = 150
    # One numbered line every 20 ms for 3 s: about half of it during the partition.
    command = (
        sys.executable,
        "-c",
        f"import time\nfor i in range({lines}):\n print(f'line {{i}}', flush=True)\n"
        " time.sleep(0.02)",
    )
    agent = trainer("v100-9", mqtt_settings(proxy.url, topic_root), tmp_path)
    raised: list[str] = []
    try:
        async with (
            running_ingestion(mqtt_settings(broker.url, topic_root)) as cloud,
            running(agent),
        ):
            await eventually(lambda: cloud.registry.get("v100-9") is not None)
            worker = DesiredTraining(job_id="etl", command=command, accelerator_ids=("gpu0",))
            await publish_desired(
                broker.url,
                topic_root,
                DesiredState(node_id="v100-9", generation=1, issued_at=1.0, training=(worker,)),
            )
            await eventually(lambda: any(c.job_id == "etl" for c in cloud.logs))
            await proxy.unplug()
            for number in range(40):  # events raised while the node is cut off
                raised.append(f"partitioned-{number}")
                agent.raise_event("probe-failed", subject=raised[-1])
                await asyncio.sleep(0.02)
            await asyncio.sleep(1.0)  # the worker goes on printing meanwhile
            assert agent.session is not None
            assert not agent.session.connected.is_set()
            await proxy.plug()
            log = tmp_path / "jobs" / "etl-0.log"
            await eventually(
                lambda: (
                    "".join(_unique_text(cloud.logs, "etl")) == _read(log)
                    and f"line {lines - 1}\n" in _read(log)
                ),
                timeout_s=20,
                message=lambda: f"{len(_unique_text(cloud.logs, 'etl'))} chunks arrived",
            )
            await eventually(
                lambda: [e.subject for e in _unique_events(cloud.events, "probe-failed")] == raised,
                timeout_s=10,
                message=lambda: str([e.subject for e in cloud.events][-5:]),
            )
    finally:
        await proxy.stop()
    assert agent.counters.outbox_dropped == 0
    assert agent.counters.outbox_expired == 0


def trainer(node_id: str, settings: MqttSettings, tmp_path: Path) -> Agent:
    """A cloud node whose workers are real processes (tmp_path/jobs) and whose state is
    kept in tmp_path/state: each call is the same node's agent started again."""
    return simulated_agent(
        node_id,
        settings,
        "v100-8x",
        site="cloud",
        training_launcher=plain_launchers(tmp_path),
        state_dir=tmp_path / "state",
    )


async def _serves(agent: Agent, deployment_id: str) -> bool:
    try:
        return await answers(agent, deployment_id) == 200
    except aiohttp.ClientError:
        return False


async def _answers_is(agent: Agent, deployment_id: str, statuses: tuple[int, ...]) -> bool:
    try:
        return await answers(agent, deployment_id) in statuses
    except aiohttp.ClientError:
        return False


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _unique_text(chunks: list, job_id: str) -> list[str]:  # type: ignore[type-arg]
    """The job's output as the cloud keeps it: chunks in offset order, each once."""
    seen: dict[int, str] = {}
    for chunk in chunks:
        if chunk.job_id == job_id:
            seen.setdefault(chunk.offset, chunk.text)
    texts = []
    expected = 0
    for offset in sorted(seen):
        assert offset == expected, f"a gap in the output at {expected} (next chunk at {offset})"
        texts.append(seen[offset])
        expected = offset + len(seen[offset].encode())
    return texts


def _unique_events(events: list, kind: str) -> list:  # type: ignore[type-arg]
    """Events of `kind` in arrival order, each `event_id` once (as the store keeps them)."""
    seen: set[str] = set()
    result = []
    for event in events:
        if event.kind == kind and event.event_id not in seen:
            seen.add(event.event_id)
            result.append(event)
    return result


async def test_events_spooled_by_an_agent_that_stopped_offline_arrive_after_its_restart(
    broker: BrokerUnderTest, topic_root: str, tmp_path: Path
) -> None:
    endpoint = parse_mqtt_url(broker.url)
    proxy = TcpProxy(endpoint.host, endpoint.port)
    await proxy.start()
    await proxy.unplug()

    def agent() -> Agent:
        return simulated_agent(
            "orin-7", mqtt_settings(proxy.url, topic_root), state_dir=tmp_path / "state"
        )

    raised = [f"first-{n}" for n in range(20)] + [f"second-{n}" for n in range(20)]
    try:
        async with running_ingestion(mqtt_settings(broker.url, topic_root)) as cloud:
            first = agent()
            async with running(first):
                await eventually(lambda: first.session is not None)  # it runs, alone
                for subject in raised[:20]:
                    first.raise_event("probe-failed", subject=subject)
            second = agent()  # the same node, started again, still without its broker
            async with running(second):
                await eventually(lambda: second.session is not None)
                for subject in raised[20:]:
                    second.raise_event("probe-failed", subject=subject)
                await proxy.plug()
                await eventually(
                    lambda: (
                        [e.subject for e in _unique_events(cloud.events, "probe-failed")] == raised
                    ),
                    timeout_s=15,
                    message=lambda: str([e.subject for e in cloud.events][-5:]),
                )
                stopping = [e for e in cloud.events if e.kind == "agent-stopping"]
                # The first instance stopped alone: its goodbye was spooled too.
                assert [e.detail for e in stopping] == ["stopped while the broker was unreachable"]
    finally:
        await proxy.stop()


async def test_training_outlives_an_agent_restart_and_a_reboot_is_reported_at_once(
    broker: BrokerUnderTest, topic_root: str, tmp_path: Path
) -> None:
    settings = mqtt_settings(broker.url, topic_root)
    release = tmp_path / "release"
    # Prints its pid once, then waits for the test to let it finish.
    command = (
        sys.executable,
        "-c",
        f"import os, pathlib, time\nprint('worker', os.getpid(), flush=True)\n"
        f"while not pathlib.Path({str(release)!r}).exists():\n time.sleep(0.05)\n"
        "print('done', flush=True)\n",
    )
    jobs = tmp_path / "jobs"

    def agent() -> Agent:
        return trainer("v100-5", settings, tmp_path)

    def reported(instance: Agent, job_id: str) -> tuple[str, int | None, str] | None:
        record = cloud.registry.get("v100-5")
        if record is None or record.reported is None:
            return None
        if record.reported.instance_id != instance.instance_id:
            return None
        found = [t for t in record.reported.training if t.job_id == job_id]
        return (found[0].state, found[0].exit_code, found[0].reason) if found else None

    def worker(job_id: str) -> WorkerRecord:
        found = load_record(jobs / f"{job_id}-0.run")
        assert found is not None
        return found

    async with running_ingestion(settings) as cloud:
        first = agent()
        async with running(first):
            await eventually(lambda: cloud.registry.get("v100-5") is not None)
            job = DesiredTraining(job_id="resnet", command=command, accelerator_ids=("gpu0",))
            await publish_desired(
                broker.url,
                topic_root,
                DesiredState(node_id="v100-5", generation=1, issued_at=1.0, training=(job,)),
            )
            await eventually(lambda: reported(first, "resnet") == ("running", None, ""))
            started = worker("resnet")
        # The agent stopped (as `systemctl restart` with KillMode=process would stop it):
        # the worker did not.
        assert is_alive(started.pid, started.process_started)
        second = agent()
        async with running(second):
            await eventually(lambda: reported(second, "resnet") == ("running", None, ""))
            assert worker("resnet").pid == started.pid  # taken back, not started again
            release.touch()
            await eventually(
                lambda: reported(second, "resnet") == ("succeeded", 0, ""), timeout_s=15
            )
            await eventually(lambda: "done" in "".join(_unique_text(cloud.logs, "resnet")))
            output = "".join(_unique_text(cloud.logs, "resnet"))
            assert output.count("worker ") == 1  # one run of the job, its output once
            # Once deduplicated by event_id as the store does (a record in flight when its
            # agent stopped is sent again by the next one).
            starts = [e for e in _unique_events(cloud.events, "started") if e.subject == "resnet"]
            assert len(starts) == 1

            # A worker that is gone when its agent starts (the node rebooted) is reported
            # lost as soon as the agent is up, not after a timeout.
            release.unlink()
            lost = DesiredTraining(job_id="bert", command=command, accelerator_ids=("gpu1",))
            await publish_desired(
                broker.url,
                topic_root,
                DesiredState(node_id="v100-5", generation=2, issued_at=2.0, training=(lost,)),
            )
            await eventually(lambda: reported(second, "bert") == ("running", None, ""))
            doomed = worker("bert")
        # The reboot: every worker gone, its wrapper and its processes.
        notice = read_started(jobs / "bert-0.started")
        assert notice is not None
        for group in (doomed.pid, *notice["process_groups"]):
            os.killpg(group, signal.SIGKILL)
        await eventually(lambda: not is_alive(doomed.pid, doomed.process_started))
        third = agent()
        async with running(third):
            await eventually(
                lambda: reported(third, "bert") == ("stopped", None, LOST_REASON), timeout_s=5
            )


async def test_a_worker_withdrawn_while_no_agent_ran_is_stopped_by_the_next_one(
    broker: BrokerUnderTest, topic_root: str, tmp_path: Path
) -> None:
    settings = mqtt_settings(broker.url, topic_root)
    jobs = tmp_path / "jobs"
    # It ignores SIGTERM, so its withdrawal takes the whole grace period.
    command = (
        sys.executable,
        "-c",
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', flush=True)\ntime.sleep(120)\n",
    )

    def agent() -> Agent:
        return trainer("v100-6", settings, tmp_path)

    async with running_ingestion(settings) as cloud:
        first = agent()
        async with running(first):
            await eventually(lambda: cloud.registry.get("v100-6") is not None)
            job = DesiredTraining(
                # Longer than a loaded machine takes to shut the first agent down after the
                # withdrawal, so the worker is still there when the second one starts.
                job_id="stray",
                command=command,
                accelerator_ids=("gpu0",),
                grace_period_s=8.0,
            )
            await publish_desired(
                broker.url,
                topic_root,
                DesiredState(node_id="v100-6", generation=1, issued_at=1.0, training=(job,)),
            )
            await eventually(lambda: load_record(jobs / "stray-0.run") is not None)
            stray = load_record(jobs / "stray-0.run")
            assert stray is not None
            await eventually(lambda: "up" in _read(jobs / "stray-0.log"))
            # Withdrawn; the agent stops before the grace period is over.
            await publish_desired(
                broker.url,
                topic_root,
                DesiredState(node_id="v100-6", generation=2, issued_at=2.0),
            )
            await eventually(lambda: first.counters.desired_received >= 2)
        assert is_alive(stray.pid, stray.process_started, stray.boot_id)  # left behind
        second = agent()  # its document (from disk, then the broker's) does not list it
        async with running(second):
            await eventually(
                lambda: not is_alive(stray.pid, stray.process_started, stray.boot_id),
                timeout_s=30,
                message="the left-behind worker still runs",
            )
