"""An edge agent on its own (issue 15): how soon a restarted agent serves again from its
state directory without its broker, and how fast its outbox empties once the broker
is back.

    python benchmarks/agent_autonomy.py --restores 7 --events 20000 --replays 3

Real agents (edge.agent.Agent) on simulated hardware (sim_devices, the
`jetson-orin-nano` profile), in this process; the broker is the local Mosquitto
(`--mqtt-url`, anonymous).

Restore, `--restores` runs, a fresh agent and directories each: the state directory
holds a `desired` document signed with a fresh Ed25519 key (the agent trusts its
public half) with one CPU inference deployment of a small MLP (x[1, 4] -> y[1, 3])
whose file is already in the model cache, and the agent's broker is a closed local
port. Timed from constructing the agent (it opens its state files and spool) and
starting `agent.run()` until the first 200 from `POST /v1/infer/{deployment_id}`
(polled every 5 ms); the answer is checked against numpy. The first run also pays
for importing ONNX Runtime and aiohttp's server, as a restarted process would: it
is reported on its own as well. The bound is the issue's, 5 s.

Outbox replay, `--replays` runs: an agent with a state directory, whose broker is a
local TCP proxy that is not listening yet (connections refused), raises `--events`
events while offline: the raw append rate (`raise_event` calls per second, each
record written and flushed to the spool's segment files). Then the proxy listens on
the same port, forwarding to the broker, and a subscriber in a child process (on
the node's `events` topic, QoS 1) times from then until every one of the events has
arrived: `from_reachable_s` includes the agent's reconnect backoff (0.05 s doubling
to 0.5 s, as in the tests), `from_connected_s` starts at the agent's CONNACK.
Events lost, received twice or out of order are counted. Medians over the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import multiprocessing
import multiprocessing.queues
import multiprocessing.synchronize
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import aiomqtt
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.inference_bench import free_port, small_mlp
from edge.agent import Agent, NodeIdentity
from edge.agent.state_files import DESIRED_FILE, OUTBOX_DIR
from edge.inference.model_fetch import ModelCache
from edge.inference.options import InferenceOptions
from shared.desired_signature import public_key_base64, sign_desired
from shared.logs import configure_logging
from shared.messages import EVENT_DECODER, DesiredDeployment, DesiredState
from shared.settings import MqttSettings, parse_mqtt_url
from shared.tasks import stop_task
from shared.topics import Channel, Topics
from sim_devices.probes import SimulatedNode
from sim_devices.profiles import get_profile
from tests.support.tcp_proxy import TcpProxy  # the tests' proxy, which can cut the network

# The bound: a restarted agent serves its deployments again within this long.
RESTORE_BOUND_S = 5.0
PROFILE = "jetson-orin-nano"
NODE_ID = "orin-autonomy"
DEPLOYMENT_ID = "mlp-autonomy"
X = [[1.0, -2.0, 0.5, 3.0]]
# Marks the benchmark's own events among the agent's (agent-started, agent-stopping).
TAG = "autonomy-bench"


def mlp_reference(x: list[list[float]]) -> np.ndarray:
    """What `small_mlp` answers for `x` (its weights: default_rng(7), as it draws them)."""
    rng = np.random.default_rng(7)
    weights = rng.standard_normal((4, 3)).astype(np.float32)
    bias = rng.standard_normal(3).astype(np.float32)
    result: np.ndarray = np.maximum(np.asarray(x, np.float32) @ weights + bias, 0.0)
    return result


def mqtt_settings(url: str, topic_root: str) -> MqttSettings:
    return MqttSettings(
        url=url, topic_root=topic_root, reconnect_initial_s=0.05, reconnect_max_s=0.5, keepalive_s=5
    )


def simulated_agent(
    settings: MqttSettings,
    state_dir: Path,
    *,
    inference: InferenceOptions | None = None,
    control_plane_public_key: str = "",
) -> Agent:
    """A real agent on simulated hardware, as tests/support/fleet.py builds one."""
    node = SimulatedNode(NODE_ID, get_profile(PROFILE), random.Random(1))
    identity = NodeIdentity(
        node_id=NODE_ID, site="edge", zone="CA-ON", region="northamerica-northeast2"
    )
    return Agent(
        identity,
        node.probes(),
        settings,
        telemetry_interval_s=1.0,
        telemetry_jitter_ratio=0.0,
        rng=random.Random(1),
        inference=inference,
        control_plane_public_key=control_plane_public_key,
        state_dir=state_dir,
    )


async def until(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        await asyncio.sleep(0.01)


def spool_bytes(state_dir: Path) -> tuple[int, int]:
    """Bytes and number of the outbox's segment files on disk."""
    segments = list((state_dir / OUTBOX_DIR).glob("*.seg"))
    return sum(path.stat().st_size for path in segments), len(segments)


# -- restore -----------------------------------------------------------------------


def prepare_restore(root: Path, model: bytes, key: Ed25519PrivateKey) -> tuple[Path, Path]:
    """A state directory holding a signed `desired` document with one deployment of
    `model`, and a model cache that already has it: (state_dir, cache_dir)."""
    state_dir, cache_dir = root / "state", root / "models"
    state_dir.mkdir()
    cache_dir.mkdir()
    sha256 = hashlib.sha256(model).hexdigest()
    ModelCache(cache_dir, max_bytes=1 << 30).path(sha256).write_bytes(model)
    deployment = DesiredDeployment(
        deployment_id=DEPLOYMENT_ID,
        model_id="model-autonomy",
        # Never fetched: the file is in the cache (a closed port, were it tried).
        model_url=f"http://127.0.0.1:{free_port()}/v1/models/model-autonomy/content",
        model_sha256=sha256,
        model_size_bytes=len(model),
        accelerator_kind="cpu",
        accelerators=1,
    )
    document = DesiredState(
        node_id=NODE_ID,
        generation=3,
        deployments=(deployment,),
        issued_at=time.time(),
        cluster_id="cluster-autonomy",
    )
    (state_dir / DESIRED_FILE).write_bytes(sign_desired(document, key))
    return state_dir, cache_dir


async def one_restore(http: aiohttp.ClientSession, model: bytes, timeout_s: float) -> float:
    key = Ed25519PrivateKey.generate()
    with tempfile.TemporaryDirectory(prefix="greenfed-autonomy-") as workdir:
        state_dir, cache_dir = prepare_restore(Path(workdir), model, key)
        unreachable = f"mqtt://127.0.0.1:{free_port()}"  # nothing listens there
        started = time.monotonic()
        agent = simulated_agent(
            mqtt_settings(unreachable, f"gfbench-{uuid.uuid4().hex[:8]}"),
            state_dir,
            inference=InferenceOptions(cache_dir=cache_dir, port=0),
            control_plane_public_key=public_key_base64(key),
        )
        task = asyncio.create_task(agent.run(), name="restored-agent")
        try:
            async with asyncio.timeout(timeout_s):
                outputs = await first_answer(agent, http)
            restore_s = time.monotonic() - started
        finally:
            await stop_task(task)
        np.testing.assert_allclose(outputs, mlp_reference(X), rtol=1e-5)
        if agent.counters.desired_restored != 1:
            raise RuntimeError(f"desired_restored = {agent.counters.desired_restored}, not 1")
        if agent.session is None or agent.session.connect_count:
            raise RuntimeError("the agent reached a broker: the restore was not offline")
        return restore_s


async def first_answer(agent: Agent, http: aiohttp.ClientSession) -> Any:
    """The outputs of the first 200 from the agent's inference endpoint."""
    while True:
        port = agent.inference_port
        if port is not None:
            url = f"http://127.0.0.1:{port}/v1/infer/{DEPLOYMENT_ID}"
            with contextlib.suppress(aiohttp.ClientError):
                async with http.post(url, json={"inputs": {"x": X}}) as answer:
                    if answer.status == 200:
                        return (await answer.json())["outputs"]["y"]
        await asyncio.sleep(0.005)


async def restores(args: argparse.Namespace) -> dict[str, Any]:
    model = small_mlp()
    async with aiohttp.ClientSession() as http:
        runs = [await one_restore(http, model, args.restore_timeout) for _ in range(args.restores)]
    return {
        "runs_s": [round(s, 3) for s in runs],
        "first_run_s": round(runs[0], 3),
        "median_s": round(statistics.median(runs), 3),
        "min_s": round(min(runs), 3),
        "max_s": round(max(runs), 3),
        "bound_s": RESTORE_BOUND_S,
        "within_bound": max(runs) <= RESTORE_BOUND_S,
    }


# -- outbox replay -----------------------------------------------------------------


def subscriber_process(
    mqtt_url: str,
    topic: str,
    expected: int,
    timeout_s: float,
    subscribed: multiprocessing.synchronize.Event,
    results: multiprocessing.queues.Queue[dict[str, Any]],
) -> None:
    """The cloud's side, in its own process so that it does not share the agent's loop
    and core: counts the benchmark's events on `topic` until `expected` distinct ones."""
    results.put(asyncio.run(subscribe(mqtt_url, topic, expected, timeout_s, subscribed)))


async def subscribe(
    mqtt_url: str,
    topic: str,
    expected: int,
    timeout_s: float,
    subscribed: multiprocessing.synchronize.Event,
) -> dict[str, Any]:
    endpoint = parse_mqtt_url(mqtt_url)
    event_ids: set[str] = set()
    numbers: set[int] = set()
    received = duplicates = out_of_order = others = 0
    highest = -1
    first_at = last_at = None
    async with aiomqtt.Client(
        endpoint.host, endpoint.port, identifier=f"autonomy-cloud-{uuid.uuid4().hex[:8]}"
    ) as client:
        await client.subscribe(topic, qos=1)
        subscribed.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                async for message in client.messages:
                    assert isinstance(message.payload, bytes)
                    event = EVENT_DECODER.decode(message.payload)
                    if event.subject != TAG:
                        others += 1  # the agent's own: agent-started, agent-stopping
                        continue
                    received += 1
                    first_at = first_at or time.monotonic()
                    number = int(event.detail)
                    if event.event_id in event_ids:
                        duplicates += 1
                        continue
                    if number < highest:
                        out_of_order += 1
                    highest = max(highest, number)
                    event_ids.add(event.event_id)
                    numbers.add(number)
                    if len(event_ids) == expected:
                        last_at = time.monotonic()
                        break
            # Anything sent twice arrives right behind: listen a little longer.
            async with asyncio.timeout(0.5):
                async for message in client.messages:
                    assert isinstance(message.payload, bytes)
                    if EVENT_DECODER.decode(message.payload).subject == TAG:
                        received += 1
                        duplicates += 1
    return {
        "distinct": len(event_ids),
        "distinct_numbers": len(numbers),
        "received": received,
        "duplicates": duplicates,
        "out_of_order": out_of_order,
        "others": others,
        "first_at": first_at,  # time.monotonic() is system-wide: comparable with the parent's
        "all_at": last_at,
    }


async def one_replay(args: argparse.Namespace, context: Any) -> dict[str, Any]:
    broker = parse_mqtt_url(args.mqtt_url)
    topic_root = f"gfbench-{uuid.uuid4().hex[:8]}"
    topic = Topics(topic_root).node(NODE_ID, Channel.EVENTS)
    subscribed = context.Event()
    results = context.Queue()
    cloud = context.Process(
        target=subscriber_process,
        args=(args.mqtt_url, topic, args.events, args.replay_timeout, subscribed, results),
        daemon=True,
    )
    cloud.start()
    # A local port that refuses connections (nothing listens) until plugged, then
    # forwards each connection to the broker.
    proxy = TcpProxy(broker.host, broker.port)
    await proxy.start()
    await proxy.unplug()
    try:
        if not await asyncio.to_thread(subscribed.wait, 30):
            raise RuntimeError("the subscriber did not subscribe")
        with tempfile.TemporaryDirectory(prefix="greenfed-autonomy-") as workdir:
            state_dir = Path(workdir) / "state"
            agent = simulated_agent(
                mqtt_settings(proxy.url, topic_root),
                state_dir,
                # Enrolled, as a deployed node is (else it raises `desired-rejected`).
                control_plane_public_key=public_key_base64(Ed25519PrivateKey.generate()),
            )
            task = asyncio.create_task(agent.run(), name="offline-agent")
            try:
                # Discovered, modules built, trying to connect (and refused).
                await until(lambda: agent.session is not None and agent.session.failed_attempts > 0)
                begun = time.monotonic()
                for number in range(args.events):
                    agent.raise_event("ready", subject=TAG, detail=str(number))
                append_s = time.monotonic() - begun
                on_disk_bytes, segments = spool_bytes(state_dir)
                session = agent.session
                assert session is not None
                if session.connect_count:
                    raise RuntimeError("the agent reached the broker before the proxy listened")
                reachable_at = time.monotonic()
                await proxy.plug()
                async with asyncio.timeout(30):
                    await session.connected.wait()
                connected_at = time.monotonic()
                outcome: dict[str, Any] = await asyncio.to_thread(
                    results.get, timeout=args.replay_timeout + 30
                )
                counters = agent.counters
                sent, dropped, expired = (
                    counters.outbox_sent,
                    counters.outbox_dropped,
                    counters.outbox_expired,
                )
                after_bytes, _ = spool_bytes(state_dir)
            finally:
                await stop_task(task)
    finally:
        await proxy.stop()
        cloud.join(10)
        if cloud.is_alive():
            cloud.kill()
    all_at = outcome["all_at"]
    replay: dict[str, Any] = {
        "append_per_s": round(args.events / append_s),
        "spool_bytes_before_replay": on_disk_bytes,
        "spool_segments_before_replay": segments,
        "spool_bytes_after_replay": after_bytes,
        "connect_after_reachable_s": round(connected_at - reachable_at, 3),
        "from_reachable_s": round(all_at - reachable_at, 3) if all_at else None,
        "from_connected_s": round(all_at - connected_at, 3) if all_at else None,
        "events_per_s": round(args.events / (all_at - reachable_at)) if all_at else None,
        "events_per_s_from_connected": round(args.events / (all_at - connected_at))
        if all_at
        else None,
        "outbox_sent": sent,
        "outbox_dropped": dropped,
        "outbox_expired": expired,
        "lost": args.events - outcome["distinct"],
    }
    replay |= {k: outcome[k] for k in ("received", "duplicates", "out_of_order", "others")}
    return replay


async def replays(args: argparse.Namespace) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    runs = [await one_replay(args, context) for _ in range(args.replays)]

    def median(key: str) -> float | None:
        values = [run[key] for run in runs if run[key] is not None]
        return statistics.median(values) if len(values) == len(runs) else None

    def spread(key: str) -> list[Any]:
        values = [run[key] for run in runs if run[key] is not None]
        return [min(values), max(values)] if values else []

    return {
        "runs": runs,
        "median_events_per_s": median("events_per_s"),
        "events_per_s_range": spread("events_per_s"),
        "median_events_per_s_from_connected": median("events_per_s_from_connected"),
        "median_from_reachable_s": median("from_reachable_s"),
        "median_append_per_s": median("append_per_s"),
        "append_per_s_range": spread("append_per_s"),
        "median_spool_bytes_before_replay": median("spool_bytes_before_replay"),
        "spool_bytes_per_event": round(
            statistics.median(run["spool_bytes_before_replay"] for run in runs) / args.events, 1
        ),
        "lost_total": sum(run["lost"] for run in runs),
        "duplicates_total": sum(run["duplicates"] for run in runs),
        "out_of_order_total": sum(run["out_of_order"] for run in runs),
        "outbox_dropped_total": sum(run["outbox_dropped"] for run in runs),
        "outbox_expired_total": sum(run["outbox_expired"] for run in runs),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    restore = await restores(args) if args.restores else None
    replay = await replays(args) if args.replays else None
    return {
        "profile": PROFILE,
        "mqtt_url": args.mqtt_url,
        "restores": args.restores,
        "events": args.events,
        "replays": args.replays,
        "restore": restore,
        "outbox_replay": replay,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mqtt-url", default="mqtt://127.0.0.1:1883")
    parser.add_argument("--restores", type=int, default=7, help="restore runs (0: none)")
    parser.add_argument("--restore-timeout", type=float, default=60.0, help="per run, s")
    parser.add_argument("--events", type=int, default=20_000, help="events spooled per replay")
    parser.add_argument("--replays", type=int, default=3, help="replay runs (0: none)")
    parser.add_argument("--replay-timeout", type=float, default=300.0, help="per run, s")
    parser.add_argument("--log-level", default="error", help="the agents' log level (stderr)")
    args = parser.parse_args()
    configure_logging(args.log_level, stream=sys.stderr)
    json.dump(asyncio.run(run(args)), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
