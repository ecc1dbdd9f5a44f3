"""A fleet of 10,000 (issue 28): real agents against one control plane on Mosquitto.

    python benchmarks/fleet_scale.py --nodes 10000 --processes 4 --jobs 10000 --window 60

1. A Mosquitto of its own on a free port (`--mqtt-url` to use another), configured
   for the fleet: no connection limit, no persistence, deploy/mosquitto's
   `max_queued_messages 10000` (`--broker-queue`).
2. `greenfed cloud` in its own process: SQLite in a temporary data directory, or a
   temporary schema of `--postgres-url` with `--backend postgresql`.
3. `greenfed sim --sim N --processes P`: N real agents, each its own MQTT connection,
   telemetry every `--interval` s; timed until `/v1/nodes?state=online` counts N
   (at most `--online-timeout` s; the count is recorded either way).
4. `--jobs` training jobs queued over REST by `--clients` clients (`--jobs-first`:
   before step 3, while passes over no nodes are short). Each asks for a node label
   no node has (`node_selector`), so the whole queue stays pending and every pass
   weighs every job against every node.
5. Over `--window` s: the scheduling passes (`greenfed_scheduling_last_pass_seconds`
   read from `/metrics` each time `greenfed_scheduling_passes` moves), the `/metrics`
   scrape itself, `/v1/nodes` walked page by page with the admin token, the CPU of
   the control plane, the sim processes and the broker, the control plane's RSS, and
   how many nodes the control plane counted offline; `--py-spy FILE` also records the
   control plane's profile over the window.
6. The fleet stops; every agent's telemetry count (the sim's last line) against what
   the control plane ingested (`greenfed_mqtt_messages_ingested{channel="telemetry"}`)
   over the whole run, from the first connection to the last goodbye. An agent counts
   a sample once it is handed to its MQTT connection, and the sim says its count only
   once every agent has stopped: the control plane ingests at most that many (a node's
   sample twice never: its sequence number), so `telemetry_lost` is never negative.

`--sim-nice 10` runs the sim processes at a lower priority: on this benchmark's 2-core
machine the 4 sim processes take 1.3 cores and leave the control plane a quarter of one,
where in a deployment the agents run on machines of their own. The control plane and the
broker then come first; whether the agents still keep their interval shows in
`telemetry_lost` and `offline_max_in_window`.

`--api-replicas N` (PostgreSQL) starts N API-only `greenfed cloud` processes beside
the first, the scheduling leader (benchmarks/api_replicas.py): same schema and broker,
`scheduling.enabled = false`, no shared group (each ingests all telemetry). The jobs
are queued, the pages walked and the scrapes asked through them, round robin; the
pass times still come from the leader, whose `/metrics` is read as often
(`--scrape-every`, timed on its own). Every process's CPU, RSS, event-loop lag
(`greenfed_event_loop_lag_seconds` on its own `/metrics`, from the window's start to
its end), online count and telemetry ingested are reported under `by_process`.

`--in-process RUNS` instead times the `/metrics` exposition and the `/v1/nodes` pages
alone, in this process, over `--nodes` of the same fleet, every node given a new sample
before each run: their own CPU and wall seconds, without a control plane's event loop
to wait for, and how long pages asked for while a scrape is written wait for this
process's loop. Run from a copy of an older tree (this file copied in), it times that
tree's way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from benchmarks.api_replicas import api_replicas
from benchmarks.lifecycle_bench import DEFAULT_POSTGRES_URL, database_env
from tests.support.brokers import free_port

MOSQUITTO_CONFIG = """\
listener {port} 127.0.0.1
allow_anonymous true
max_connections -1
persistence false
log_dest none
max_queued_messages {queue}
"""
STOPPED = re.compile(r"simulated fleet: (\d+) nodes stopped, (\d+) telemetry messages sent")
CONNECTED = re.compile(r"simulated fleet: (\d+) nodes connected")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", re.MULTILINE)
# Where the per-node and per-accelerator series of a `/metrics` body begin: every
# series this benchmark reads comes before (cloud/metrics.py writes the fleet
# registry's families first), so the tens of megabytes after are neither decoded nor
# parsed here: that would hold this process's loop, where the pages are timed.
PER_NODE_SERIES = b"# HELP greenfed_node_up "
LAG = "greenfed_event_loop_lag_seconds"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(share * len(ordered)) - 1)]


def registry_head(body: bytes) -> str:
    """The `/metrics` body before its per-node and per-accelerator series."""
    end = body.find(PER_NODE_SERIES)
    return (body if end < 0 else body[:end]).decode()


def metric(text: str, name: str, labels: str = "") -> float | None:
    for match in SAMPLE.finditer(text):
        if match[1] == name and (not labels or labels in (match[2] or "")):
            return float(match[3])
    return None


@contextlib.contextmanager
def private_mosquitto(tmp: Path, queue: int) -> Any:
    port = free_port()
    config = tmp / "mosquitto.conf"
    config.write_text(MOSQUITTO_CONFIG.format(port=port, queue=queue))
    config.chmod(0o644)
    broker = subprocess.Popen(
        ["mosquitto", "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            if time.monotonic() > deadline or broker.poll() is not None:
                raise RuntimeError("the private mosquitto did not start")
            time.sleep(0.05)
        yield f"mqtt://127.0.0.1:{port}", broker.pid
    finally:
        broker.terminate()
        broker.wait(10)


def child_env(env: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GREENFED_")}
    return base | env | {"PYTHONUNBUFFERED": "1", "GREENFED_LOG__LEVEL": "error"}


@contextlib.asynccontextmanager
async def control_plane(env: dict[str, str], api: str, data_dir: Path) -> AsyncIterator[Any]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "greenfed.cli",
        "cloud",
        env=child_env(env),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        token_file = data_dir / "admin-token"
        async with asyncio.timeout(120), aiohttp.ClientSession() as http:
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{api}/healthz") as response:
                        if response.status == 200 and token_file.exists():
                            break
                await asyncio.sleep(0.1)
        yield process, token_file.read_text().split()[-1]
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await process.wait()


async def queue_jobs(
    http: aiohttp.ClientSession, apis: list[str], token: str, jobs: int, clients: int
) -> float:
    """`jobs` queued by `clients` clients, client i through `apis[i % len(apis)]`."""
    headers = {"Authorization": f"Bearer {token}"}
    numbers = iter(range(jobs))
    started = time.perf_counter()

    async def client(api: str) -> None:
        for number in numbers:
            body = {
                "name": f"fleet-{number}",
                "command": ["python", "train.py"],
                "estimated_duration_s": 600.0,
                # No node has it: the job stays queued, weighed against every node.
                "node_selector": {"fleet-scale": "nowhere"},
            }
            key = {"Idempotency-Key": uuid.uuid4().hex}
            async with http.post(f"{api}/v1/jobs", json=body, headers=headers | key) as response:
                if response.status != 201:
                    raise RuntimeError(f"job {number}: {response.status} {await response.text()}")
                await response.read()

    await asyncio.gather(*(client(apis[index % len(apis)]) for index in range(clients)))
    return time.perf_counter() - started


async def nodes_total(http: aiohttp.ClientSession, api: str, admin: str, state: str) -> int:
    headers = {"Authorization": f"Bearer {admin}"}
    async with http.get(f"{api}/v1/nodes?state={state}&limit=1", headers=headers) as response:
        response.raise_for_status()
        return int((await response.json())["total"])


async def walk_nodes(
    http: aiohttp.ClientSession, api: str, admin: str, page_size: int
) -> tuple[list[float], int]:
    """Every page of `/v1/nodes`; (each page's seconds, nodes seen)."""
    headers = {"Authorization": f"Bearer {admin}"}
    latencies: list[float] = []
    seen: list[str] = []
    cursor: str | None = None
    while True:
        params = {"limit": str(page_size)} | ({"cursor": cursor} if cursor else {})
        started = time.perf_counter()
        async with http.get(f"{api}/v1/nodes", params=params, headers=headers) as response:
            response.raise_for_status()
            page = await response.json()
        latencies.append(time.perf_counter() - started)
        seen += [item["node_id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    if seen != sorted(set(seen)):
        raise RuntimeError("the pages repeated or reordered nodes")
    return latencies, len(seen)


class CpuMeter:
    """CPU seconds of a set of processes (and their children) between two readings."""

    def __init__(self, pids: list[int]) -> None:
        self._processes = [psutil.Process(pid) for pid in pids]
        self._processes += [c for p in list(self._processes) for c in p.children(recursive=True)]
        self._start = self._cpu_s()
        self._started = time.monotonic()

    def _cpu_s(self) -> float:
        total = 0.0
        for process in self._processes:
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                total += times.user + times.system
        return total

    def cores(self) -> float:
        return (self._cpu_s() - self._start) / (time.monotonic() - self._started)


@dataclass
class ControlPlaneProcess:
    """One `greenfed cloud` process (the leader or an API replica) and what the window
    saw of it."""

    name: str
    api: str
    process: psutil.Process
    cpu: CpuMeter | None = None
    cpu_cores: float | None = None  # over the window, read as it ends
    rss_max: int = 0
    # Its loop-lag histogram's cumulative counts by bucket bound, at the window's
    # start and at the latest scrape; the worst lag any scrape in the window read.
    lag_start: dict[float, float] = field(default_factory=dict)
    lag_latest: dict[float, float] = field(default_factory=dict)
    lag_max_s: float = 0.0
    scrapes: list[float] = field(default_factory=list)
    pages: list[float] = field(default_factory=list)
    offline_max: int = 0

    def read(self, head: str) -> None:
        """What a scrape's body (`registry_head`) says of this process."""
        self.lag_latest = lag_buckets(head)
        self.lag_max_s = max(
            self.lag_max_s, metric(head, "greenfed_event_loop_lag_max_seconds") or 0
        )
        offline = sum(
            float(m[3])
            for m in SAMPLE.finditer(head)
            if m[1] == "greenfed_nodes" and 'state="offline"' in (m[2] or "")
        )
        self.offline_max = max(self.offline_max, int(offline))
        with contextlib.suppress(psutil.Error):
            self.rss_max = max(self.rss_max, self.process.memory_info().rss)

    def figures(self) -> dict[str, Any]:
        lag = {le: self.lag_latest.get(le, 0.0) - n for le, n in self.lag_start.items()}
        samples = lag.get(math.inf, 0.0)
        figures: dict[str, Any] = {
            "cpu_cores": self.cpu_cores,
            "rss_mb_max": round(self.rss_max / 1e6),
            "loop_lag_samples": int(samples),
            "loop_lag_over_100ms": int(samples - lag.get(0.1, 0.0)),
            # The bound of the histogram bucket that holds the 99th percentile.
            "loop_lag_p99_le_ms": next(
                (round(le * 1000) for le in sorted(lag) if lag[le] >= 0.99 * samples), None
            )
            if samples
            else None,
            "loop_lag_max_ms": round(self.lag_max_s * 1000),
            "offline_max_in_window": self.offline_max,
        }
        if self.scrapes:
            figures["scrapes"] = len(self.scrapes)
            figures["metrics_scrape_ms_median"] = round(statistics.median(self.scrapes) * 1000)
            figures["metrics_scrape_ms_max"] = round(max(self.scrapes) * 1000)
        if self.pages:
            figures["nodes_pages"] = len(self.pages)
            figures["nodes_page_ms_p50"] = round(percentile(self.pages, 0.5) * 1000, 1)
            figures["nodes_page_ms_p99"] = round(percentile(self.pages, 0.99) * 1000, 1)
        return figures


def lag_buckets(head: str) -> dict[float, float]:
    """`greenfed_event_loop_lag_seconds`'s cumulative bucket counts by bound (s)."""
    buckets = {}
    for match in SAMPLE.finditer(head):
        if match[1] == f"{LAG}_bucket":
            bound = re.search(r'le="([^"]+)"', match[2] or "")
            if bound:
                buckets[float(bound[1])] = float(match[3])
    return buckets


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "nodes": args.nodes,
        "processes": args.processes,
        "jobs": args.jobs,
        "api_replicas": args.api_replicas,
        "sim_nice": args.sim_nice,
    }
    with tempfile.TemporaryDirectory() as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        if args.mqtt_url:
            mqtt_url, broker_pid = args.mqtt_url, None
        else:
            mqtt_url, broker_pid = stack.enter_context(private_mosquitto(tmp, args.broker_queue))
        data_dir = tmp / "data"
        port = free_port()
        api = f"http://127.0.0.1:{port}"
        topic_root = f"fleet-{uuid.uuid4().hex[:8]}"
        common = {"GREENFED_MQTT__URL": mqtt_url, "GREENFED_MQTT__TOPIC_ROOT": topic_root}
        async with database_env(args.backend, args.postgres_url, data_dir) as store_env:
            cloud_env = store_env | common
            cloud_env |= {
                "GREENFED_CLOUD__API_PORT": str(port),
                "GREENFED_CLOUD__MAX_NODES": str(max(10_000, args.nodes)),
            }
            async with (
                control_plane(cloud_env, api, data_dir) as (cloud, admin),
                api_replicas(cloud_env, args.api_replicas, data_dir) as replicas,
                aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=args.http_timeout)
                ) as http,
            ):
                leader = ControlPlaneProcess("leader", api, psutil.Process(cloud.pid))
                processes = [leader] + [
                    ControlPlaneProcess(f"replica-{number}", replica.api, replica.process)
                    for number, replica in enumerate(replicas, 1)
                ]
                serving = [replica.api for replica in replicas] or [api]
                admin_headers = {"Authorization": f"Bearer {admin}"}
                async with http.post(
                    f"{api}/v1/tenants", json={"name": "fleet"}, headers=admin_headers
                ) as response:
                    tenant = str((await response.json())["token"])
                if args.jobs_first:  # while no node is there, passes are short
                    queued_s = await queue_jobs(http, serving, tenant, args.jobs, args.clients)
                    result["queue_jobs_s"] = round(queued_s, 1)
                    print(f"{args.jobs} jobs queued in {queued_s:.1f} s", flush=True)
                sim_env = child_env(
                    common
                    | {
                        "GREENFED_AGENT__TELEMETRY_INTERVAL_S": str(args.interval),
                    }
                )
                sim = subprocess.Popen(  # noqa: ASYNC220 (read from a thread below)
                    [
                        sys.executable,
                        "-m",
                        "greenfed.cli",
                        "sim",
                        "--sim",
                        str(args.nodes),
                        "--processes",
                        str(args.processes),
                        "--connect-rate",
                        str(args.connect_rate),
                    ],
                    env=sim_env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    # Its worker processes inherit it.
                    preexec_fn=(lambda: os.nice(args.sim_nice)) if args.sim_nice else None,
                )
                try:
                    await fleet_run(
                        args, result, http, processes, serving, (admin, tenant), sim, broker_pid
                    )
                finally:
                    stdout = await stopped_output(sim)
                stopped = STOPPED.search(stdout or "")
                # None: a sim process did not say (killed while stopping): no loss figure.
                sent = int(stopped[2]) if stopped else None
                if stopped is None:
                    result["sim_output_tail"] = (stdout or "")[-400:]
                await asyncio.sleep(3.0)  # what is still in flight
                result["telemetry_sent"] = sent
                for process in processes:
                    async with http.get(
                        f"{process.api}/metrics", headers=admin_headers
                    ) as response:
                        head = registry_head(await response.read())
                    ingested = int(
                        metric(head, "greenfed_mqtt_messages_ingested_total", '"telemetry"') or 0
                    )
                    invalid = {
                        (m[2] or "").strip("{}"): int(float(m[3]))
                        for m in SAMPLE.finditer(head)
                        if m[1] == "greenfed_mqtt_messages_invalid_total"
                    }
                    lost = None if sent is None else sent - ingested
                    if process is leader:
                        result["telemetry_ingested"] = ingested
                        result["invalid"] = invalid
                        result["telemetry_lost"] = lost
                    if replicas:
                        figures = result["by_process"][process.name]
                        figures["telemetry_ingested"] = ingested
                        figures["telemetry_lost"] = lost
                        figures["invalid"] = invalid
    return result


async def stopped_output(sim: subprocess.Popen[str]) -> str:
    """What the sim printed, once it has exited: SIGTERM, sent again every 10 s until
    then; at most 300 s. A sim this busy before shared/runtime.py heard every stop
    signal could miss one, its asyncio signal wakeup pipe full of its threads'
    wake-ups (RESULTS.md, issue 28): the repeat still stops an old tree's sim."""
    async with asyncio.TaskGroup() as group:
        reading = group.create_task(asyncio.to_thread(sim.communicate, timeout=300))
        while sim.poll() is None and not reading.done():
            sim.send_signal(signal.SIGTERM)
            await asyncio.wait({reading}, timeout=10.0)
    return reading.result()[0] or ""


async def fleet_run(
    args: argparse.Namespace,
    result: dict[str, Any],
    http: aiohttp.ClientSession,
    processes: list[ControlPlaneProcess],
    serving: list[str],
    tokens: tuple[str, str],
    sim: subprocess.Popen[str],
    broker_pid: int | None,
) -> None:
    """`processes[0]` is the leader; `serving`, the APIs the jobs, pages and scrapes
    go to (the API replicas', or the leader's alone)."""
    admin, tenant = tokens
    leader = processes[0]
    started = time.monotonic()
    assert sim.stdout is not None
    while not CONNECTED.search(line := await asyncio.to_thread(sim.stdout.readline)):
        if not line:
            raise RuntimeError("the sim stopped before its fleet connected")
    result["sim_connected_s"] = round(time.monotonic() - started, 1)
    online: dict[str, int] = {process.name: 0 for process in processes}
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(args.online_timeout):
            for process in processes:  # every process's registry, each whole
                while True:
                    count = await nodes_total(http, process.api, admin, "online")
                    online[process.name] = count
                    if count >= args.nodes:
                        break
                    await asyncio.sleep(1.0)  # the control plane is polled, as a person would
    fewest = min(online.values())
    result["online_before_jobs"] = fewest
    if len(processes) > 1:
        result["online_before_jobs_by_process"] = online
    result["all_online_s"] = round(time.monotonic() - started, 1) if fewest == args.nodes else None
    print(f"{fewest} nodes online after {time.monotonic() - started:.1f} s", flush=True)

    if not args.jobs_first:
        queued_s = await queue_jobs(http, serving, tenant, args.jobs, args.clients)
        result["queue_jobs_s"] = round(queued_s, 1)
        print(f"{args.jobs} jobs queued in {queued_s:.1f} s", flush=True)
    await asyncio.sleep(args.settle)

    admin_headers = {"Authorization": f"Bearer {admin}"}
    # Each process's lag histogram (and worst lag) from here on.
    for process in processes:
        async with http.get(f"{process.api}/metrics", headers=admin_headers) as response:
            process.lag_start = lag_buckets(registry_head(await response.read()))
        process.cpu = CpuMeter([process.process.pid])
        process.rss_max = process.process.memory_info().rss
    by_api = {process.api: process for process in processes}
    sim_meter = CpuMeter([sim.pid])
    broker_meter = CpuMeter([broker_pid]) if broker_pid else None
    passes: list[float] = []
    ingested_at: list[tuple[float, float]] = []  # the leader's telemetry count, by scrape
    last_passes: float | None = None
    pending: float | None = None
    ends = time.monotonic() + args.window
    # On the wall clock, for what other tools recorded meanwhile (benchmarks/loop_stalls.py).
    result["window_utc_s"] = [round(time.time(), 3), round(time.time() + args.window, 3)]

    async def scrape_once(process: ControlPlaneProcess) -> None:
        nonlocal last_passes, pending
        began = time.perf_counter()
        async with http.get(f"{process.api}/metrics", headers=admin_headers) as response:
            body = await response.read()  # timed to its last byte
        process.scrapes.append(time.perf_counter() - began)
        head = registry_head(body)
        process.read(head)
        if process is leader:
            telemetry = metric(head, "greenfed_mqtt_messages_ingested_total", '"telemetry"')
            if telemetry is not None:
                ingested_at.append((time.monotonic(), telemetry))
            count = metric(head, "greenfed_scheduling_passes_total")
            if last_passes is not None and count is not None and count > last_passes:
                passes.append(metric(head, "greenfed_scheduling_last_pass_seconds") or 0.0)
            last_passes = count
            pending = sum(
                float(m[3]) for m in SAMPLE.finditer(head) if m[1] == "greenfed_work_pending"
            )

    async def scrape() -> None:
        number = 0
        while time.monotonic() < ends:
            await scrape_once(by_api[serving[number % len(serving)]])
            number += 1
            await asyncio.sleep(args.scrape_every)

    async def watch_leader() -> None:  # its passes, when it serves no scrape
        while time.monotonic() < ends:
            await scrape_once(leader)
            await asyncio.sleep(args.scrape_every)

    async def walk() -> None:
        number = 0
        while time.monotonic() < ends:
            process = by_api[serving[number % len(serving)]]
            latencies, seen = await walk_nodes(http, process.api, admin, args.page_size)
            process.pages.extend(latencies)
            walked.append(seen)
            number += 1
            await asyncio.sleep(args.walk_every)

    walked: list[int] = []
    profiler = None
    if args.py_spy:
        profiler = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).with_name("py-spy")),
            "record",
            "--pid",
            str(leader.process.pid),
            "--duration",
            str(int(args.window)),
            "--format",
            "raw",
            "--nonblocking",
            "-o",
            args.py_spy,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
    steps = [scrape(), walk()]
    if leader.api not in serving:
        steps.append(watch_leader())
    await asyncio.gather(*steps)
    if profiler is not None:
        await profiler.wait()
    sim_cores = round(sim_meter.cores(), 2)
    broker_cores = round(broker_meter.cores(), 2) if broker_meter is not None else None
    for process in processes:
        assert process.cpu is not None
        process.cpu_cores = round(process.cpu.cores(), 2)
    for process in processes:  # the lag up to the window's end (read before the body)
        async with http.get(f"{process.api}/metrics", headers=admin_headers) as response:
            process.read(registry_head(await response.read()))
    figures = {process.name: process.figures() for process in processes}
    # The serving processes' pages and scrapes together; the leader's CPU and RSS.
    scrapes = [s for process in processes if process.api in serving for s in process.scrapes]
    pages = [page for process in processes for page in process.pages]
    result["cloud_cpu_cores"] = figures["leader"]["cpu_cores"]
    result["sim_cpu_cores"] = sim_cores
    if broker_cores is not None:
        result["broker_cpu_cores"] = broker_cores
    result["cloud_rss_mb_max"] = figures["leader"]["rss_mb_max"]
    if len(processes) > 1:
        result["control_plane_cpu_cores_total"] = round(
            sum(f["cpu_cores"] for f in figures.values()), 2
        )
        result["control_plane_rss_mb_max_total"] = sum(f["rss_mb_max"] for f in figures.values())
    result["passes"] = len(passes)
    if passes:
        result["pass_ms_median"] = round(statistics.median(passes) * 1000)
        result["pass_ms_max"] = round(max(passes) * 1000)
    if len(ingested_at) >= 2:
        # Whether the agents kept their interval in the window (with --sim-nice too).
        (first_s, first), (last_s, last) = ingested_at[0], ingested_at[-1]
        per_s = (last - first) / (last_s - first_s)
        result["telemetry_per_s_in_window"] = round(per_s)
        result["telemetry_interval_s_in_window"] = round(args.nodes / per_s, 2) if per_s else None
    result["pending_jobs"] = int(pending or 0)
    result["metrics_scrape_ms_median"] = round(statistics.median(scrapes) * 1000)
    result["metrics_scrape_ms_max"] = round(max(scrapes) * 1000)
    result["nodes_pages"] = len(pages)
    result["nodes_page_ms_p50"] = round(percentile(pages, 0.5) * 1000, 1)
    result["nodes_page_ms_p99"] = round(percentile(pages, 0.99) * 1000, 1)
    result["nodes_walked"] = sorted(set(walked))
    result["offline_max_in_window"] = max(f["offline_max_in_window"] for f in figures.values())
    result["offline_at_end"] = await nodes_total(http, serving[0], admin, "offline")
    result["online_at_end"] = await nodes_total(http, serving[0], admin, "online")
    result["by_process"] = figures
    for process in processes:
        figures[process.name]["online_at_end"] = await nodes_total(
            http, process.api, admin, "online"
        )


def in_process(
    nodes: int,
    runs: int,
    *,
    new_samples_each_run: bool = True,
    switch_interval_during_scrape_s: float = 0.0005,
) -> dict[str, Any]:
    """The own cost of a `/metrics` exposition and of `/v1/nodes` pages over `nodes` of the
    default fleet's mix, without a loop to wait for: CPU seconds (this process's, the
    exposition's worker thread included) and wall seconds, medians of `runs`.

    Each run first gives every node a new sample (as a fleet at a 5 s interval does
    between two scrapes 10 s apart, or two walks 5 s apart), so no run is served from
    what the run before kept; `--in-process-steady` leaves them as they are. Run from a
    tree before cloud/fleet/node_pages.py (PYTHONPATH=<that tree>), it times that tree's
    way: every summary built and encoded, the exposition on the caller's thread."""
    from benchmarks.metrics_scrape import register_simulated_fleet
    from cloud.fleet.ingest import Ingestor
    from cloud.fleet.registry import NodeFilter, NodeRegistry
    from cloud.metrics import build_metrics_registry
    from shared.topics import Topics

    registry = NodeRegistry(max_nodes=nodes)
    register_simulated_fleet(registry, nodes, now_s=time.time())
    metrics = build_metrics_registry(Ingestor(registry, Topics(), max_payload_bytes=1 << 20))
    page_of, exposition = _tree_under_test(registry, metrics)

    def new_samples() -> None:
        if not new_samples_each_run:
            return
        for record in list(registry):
            telemetry = record.telemetry
            assert telemetry is not None
            registry.apply_telemetry(msgspec.structs.replace(telemetry, seq=telemetry.seq + 1))

    def timed(step: Any) -> tuple[float, float, Any]:
        gc.collect()  # each step from the same start: no collection owed by the one before
        cpu, wall = time.process_time(), time.perf_counter()
        value = step()
        return time.process_time() - cpu, time.perf_counter() - wall, value

    scrape_cpu, scrape_wall, page_cpu, page_wall = [], [], [], []
    body: list[bytes] = []
    for _ in range(runs):
        new_samples()
        cpu_s, wall_s, body = timed(lambda: asyncio.run(exposition()))
        scrape_cpu.append(cpu_s)
        scrape_wall.append(wall_s)
    # Pages asked for every 20 ms while scrapes are written, as the control plane's loop
    # serves them (by default the GIL switch interval cloud/interpreter_tuning sets on
    # the leader and, since 346204c, on API-only replicas too).
    cursors = [None, *[record.node_id for record in registry.nodes()][999:-1:1000]]
    during: list[float] = []
    switch_interval_s = sys.getswitchinterval()
    sys.setswitchinterval(switch_interval_during_scrape_s)
    try:
        for _ in range(runs):
            new_samples()
            during += asyncio.run(pages_during_scrape(exposition, page_of, cursors))
    finally:
        sys.setswitchinterval(switch_interval_s)
    for _ in range(runs):
        new_samples()
        cursor: str | None = None
        while True:
            cpu_s, wall_s, listed = timed(lambda after=cursor: page_of(NodeFilter(), after))
            page_cpu.append(cpu_s)
            page_wall.append(wall_s)
            cursor = msgspec.json.decode(listed)["next_cursor"]
            if cursor is None:
                break
    return {
        "nodes": nodes,
        "exposition_cpu_ms_median": round(statistics.median(scrape_cpu) * 1000),
        "exposition_wall_ms_median": round(statistics.median(scrape_wall) * 1000),
        "exposition_wall_ms_min": round(min(scrape_wall) * 1000),
        "exposition_mb": round(sum(len(chunk) for chunk in body) / 1e6, 1),
        "nodes_page_cpu_ms_median": round(statistics.median(page_cpu) * 1000, 1),
        "nodes_page_wall_ms_p50": round(percentile(page_wall, 0.5) * 1000, 1),
        "nodes_page_wall_ms_p99": round(percentile(page_wall, 0.99) * 1000, 1),
        "nodes_page_wall_ms_min": round(min(page_wall) * 1000, 1),
        "pages_during_scrapes": len(during),
        "page_during_scrape_ms_p50": round(percentile(during, 0.5) * 1000, 1),
        "page_during_scrape_ms_p99": round(percentile(during, 0.99) * 1000, 1),
        "page_during_scrape_ms_max": round(max(during) * 1000, 1),
    }


async def pages_during_scrape(
    scrape: Any, page_of: Any, cursors: list[str | None], period_s: float = 0.02
) -> list[float]:
    """Seconds from each page's request to its body, for pages requested `period_s`
    after the one before was served (a client walking the pages), while one scrape is
    written on this loop as `/metrics` writes it: what a page waits for the event loop,
    plus its own cost."""
    from cloud.fleet.registry import NodeFilter

    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    scraped = asyncio.Event()

    async def pages() -> None:
        number = 0
        while not scraped.is_set():
            requested = loop.time() + period_s
            await asyncio.sleep(period_s)
            page_of(NodeFilter(), cursors[number % len(cursors)])
            latencies.append(loop.time() - requested)
            number += 1

    async def scrape_once() -> None:
        await asyncio.sleep(period_s / 2)  # pages are due before it starts and all along
        await scrape()
        scraped.set()

    async with asyncio.TaskGroup() as group:
        group.create_task(pages())
        group.create_task(scrape_once())
    return latencies


def _tree_under_test(registry: Any, metrics: Any) -> tuple[Any, Any]:
    """(a page's JSON for (filter, cursor), a coroutine function for a `/metrics` body's
    chunks), as this tree serves them."""
    try:
        from cloud.fleet.node_pages import NodePages
    except ImportError:  # a tree before node_pages.py: what its handler did
        from cloud.api.nodes import node_page  # type: ignore[attr-defined]
        from cloud.fleet.views import NodeList, node_summary

        def old_page(node_filter: Any, cursor: str | None) -> bytes:
            records = registry.nodes(node_filter)
            page, next_cursor = node_page(records, cursor, 1000)
            items = tuple(node_summary(record) for record in page)
            listed = NodeList(
                items=items, count=len(page), total=len(records), next_cursor=next_cursor
            )
            return msgspec.json.encode(listed)

        async def old_scrape() -> list[bytes]:
            return [metrics.fleet_exposition()]  # as its /metrics did: on the event loop

        return old_page, old_scrape
    pages = NodePages(registry)
    return (
        lambda node_filter, cursor: pages.page(node_filter, cursor, 1000, lambda record: ()),
        metrics.fleet_exposition_chunks,  # as /metrics does
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--processes", type=int, default=4, help="sim processes")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=8, help="REST clients queuing jobs")
    parser.add_argument("--interval", type=float, default=5.0, help="telemetry interval, s")
    parser.add_argument("--connect-rate", type=float, default=500.0)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=10.0, help="s after the jobs are queued")
    parser.add_argument(
        "--online-timeout", type=float, default=180.0, help="s to wait for all nodes online"
    )
    parser.add_argument(
        "--broker-queue",
        type=int,
        default=10_000,
        help="the private Mosquitto's max_queued_messages (deploy/mosquitto's: 10000)",
    )
    parser.add_argument(
        "--sim-nice",
        type=int,
        default=0,
        help="run the sim processes at this niceness (10: the control plane and the broker "
        "come first, as if the agents ran on machines of their own; 0: all alike)",
    )
    parser.add_argument("--py-spy", metavar="FILE", help="record the control plane's profile")
    parser.add_argument("--http-timeout", type=float, default=300.0, help="s per request")
    parser.add_argument(
        "--jobs-first", action="store_true", help="queue the jobs before the fleet starts"
    )
    parser.add_argument("--scrape-every", type=float, default=10.0, help="s between scrapes")
    parser.add_argument("--walk-every", type=float, default=5.0, help="s between walks")
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--mqtt-url", help="a broker to use instead of a private Mosquitto")
    parser.add_argument(
        "--api-replicas",
        type=int,
        default=0,
        help="API-only `greenfed cloud` processes beside the leader that serve the jobs, "
        "pages and scrapes (PostgreSQL; 0: the leader serves them)",
    )
    parser.add_argument(
        "--in-process",
        type=int,
        metavar="RUNS",
        help="only time the exposition and the pages in this process, RUNS times",
    )
    parser.add_argument(
        "--in-process-steady",
        action="store_true",
        help="with --in-process: no new samples between runs (what repeated reads cost)",
    )
    parser.add_argument(
        "--in-process-switch-interval",
        type=float,
        default=0.0005,
        metavar="S",
        help="with --in-process: the GIL switch interval while pages wait for a scrape "
        "(0.0005: what the leader and API-only replicas set; 0.005: Python's default)",
    )
    args = parser.parse_args()
    if args.api_replicas and args.backend != "postgresql":
        parser.error("--api-replicas needs --backend postgresql (one SQLite writer process)")
    if args.in_process:
        result = in_process(
            args.nodes,
            args.in_process,
            new_samples_each_run=not args.in_process_steady,
            switch_interval_during_scrape_s=args.in_process_switch_interval,
        )
    else:
        result = asyncio.run(measure(args))
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
