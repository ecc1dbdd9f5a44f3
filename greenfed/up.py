"""`greenfed up`: broker, control plane and a simulated fleet in one process.

The single-machine default: with no `--mqtt-url` an embedded broker starts on
`--broker-port` (or, if that port is taken and was not asked for explicitly, a
free one, which is printed).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
from aiohttp import web

from cloud.app import create_app, serving
from cloud.app_keys import ADMIN_TOKEN_FILE, BACKGROUND_TASKS, INGESTOR, REGISTRY
from cloud.main import watch_background
from cloud.summary import fleet_summary_line
from greenfed.api_client import DEFAULT_API
from greenfed.broker import EmbeddedBroker
from greenfed.ports import port_is_free
from shared.runtime import run_until_stopped
from shared.settings import Settings
from shared.token_files import read_token_file
from shared.topics import Channel, Topics
from sim_devices.fleet import load_fleet, scale_fleet
from sim_devices.runner import SimulatedFleet

DEFAULT_BROKER_PORT = 1883
# While the fleet is coming up, and then as nodes change, at most this often.
SUMMARY_INTERVAL_S = 30.0


@dataclass(frozen=True, slots=True)
class UpOptions:
    sim_nodes: int | None
    fleet_file: Path | None
    external_mqtt_url: str | None
    broker_port: int | None
    connects_per_s: float = 200.0


@contextlib.asynccontextmanager
async def _broker(options: UpOptions, host: str) -> AsyncIterator[str]:
    """Yield the MQTT url to use, starting the embedded broker if none was given."""
    if options.external_mqtt_url:
        yield options.external_mqtt_url
        return
    port = options.broker_port or DEFAULT_BROKER_PORT
    if options.broker_port is None and not port_is_free(host, port):
        port = 0  # 1883 is taken (a local Mosquitto?): any free port will do
    async with EmbeddedBroker(host, port) as broker:
        yield broker.url


async def run_up(settings: Settings, options: UpOptions, stop: asyncio.Event) -> int:
    fleet = load_fleet(options.fleet_file)
    if options.sim_nodes is not None:
        fleet = scale_fleet(fleet, options.sim_nodes)
    async with _broker(options, "127.0.0.1") as mqtt_url:
        settings = msgspec.structs.replace(
            settings, mqtt=msgspec.structs.replace(settings.mqtt, url=mqtt_url)
        )
        app = create_app(settings)
        async with serving(app, settings.cloud.api_host, settings.cloud.api_port) as runner:
            # The port the API really bound (`--api-port 0` picks a free one).
            bound_port = runner.addresses[0][1]
            api = f"http://{settings.cloud.api_host}:{bound_port}"
            simulated = SimulatedFleet(
                fleet,
                settings.mqtt,
                telemetry_interval_s=settings.agent.telemetry_interval_s,
                telemetry_jitter_ratio=settings.agent.telemetry_jitter_ratio,
                connects_per_s=options.connects_per_s,
            )
            _print_banner(
                settings,
                mqtt_url,
                api,
                external=bool(options.external_mqtt_url),
                node_count=len(simulated.agents),
                admin_token_file=app[ADMIN_TOKEN_FILE],
            )
            await run_until_stopped(
                stop,
                simulated.run(),
                watch_background(app[BACKGROUND_TASKS]),
                _report_fleet(app, len(simulated.agents)),
            )
        print("greenfed stopped", flush=True)
    return 0


def _print_banner(
    settings: Settings,
    mqtt_url: str,
    api: str,
    *,
    external: bool,
    node_count: int,
    admin_token_file: Path,
) -> None:
    topics = Topics(settings.mqtt.topic_root)
    host_port = mqtt_url.split("://", 1)[1]
    host, _, port = host_port.rpartition(":")
    lines = [
        f"greenfed up: {node_count} simulated nodes, "
        f"{'external' if external else 'embedded'} MQTT broker {mqtt_url}",
        f"  nodes      {api}/v1/nodes",
        f"  signals    {api}/v1/signals",
        f"  schemas    {api}/v1/schemas",
        f"  metrics    {api}/metrics",
        f"  telemetry  mosquitto_sub -h {host} -p {port} "
        f"-t '{topics.all_nodes(Channel.TELEMETRY)}'",
        f"  jobs       {api}/v1/jobs   (greenfed submit FILE, greenfed jobs)",
        f"  models     {api}/v1/models   (greenfed models upload FILE.onnx)",
        f"  openapi    {api}/openapi.json",
        *_cli_lines(api),
        f"  admin token: {admin_token_file}",
        # A single-machine demo: the value too, so that curl works right away.
        f"             {_token_text(admin_token_file)}",
        "  stop       Ctrl-C",
    ]
    print("\n".join(lines), flush=True)


def _cli_lines(api: str) -> list[str]:
    """How the other `greenfed` commands find this API: by themselves at the default
    address, else once the `export` line printed here is pasted into their terminal."""
    if api == DEFAULT_API:
        return ["  table      greenfed nodes"]
    return [
        f"  cli        export GREENFED_API={api}   (for greenfed nodes, jobs, submit, ...)",
        "  table      greenfed nodes",
    ]


def _token_text(path: Path) -> str:
    try:
        token = read_token_file(path)
    except OSError as error:
        return f"(cannot read it: {error.strerror})"
    if token is None:
        return "(not there: the admin was created earlier and its token file removed)"
    return token


async def _report_fleet(app: web.Application, expected_nodes: int) -> None:
    """Print the fleet summary when it is complete, then whenever it changed."""
    registry = app[REGISTRY]
    await app[INGESTOR].subscribed.wait()
    started = time.monotonic()
    printed_version = -1
    announced_complete = False
    while True:
        online = sum(1 for record in registry.nodes() if record.state == "online")
        complete = online >= expected_nodes
        if complete and not announced_complete:
            print(
                f"{fleet_summary_line(registry)} (ready in {time.monotonic() - started:.1f} s)",
                flush=True,
            )
            announced_complete = True
            printed_version = registry.version
        elif announced_complete and registry.version != printed_version:
            print(fleet_summary_line(registry), flush=True)
            printed_version = registry.version
        await asyncio.sleep(0.2 if not announced_complete else SUMMARY_INTERVAL_S)
