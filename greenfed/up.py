"""`greenfed up`: broker, control plane and a simulated fleet in one process.

The single-machine default: where nothing sets `mqtt.url` (`--mqtt-url`,
GREENFED_MQTT__URL, the config file) an embedded broker starts on `--broker-port` (or,
if that port is taken and was not asked for explicitly, a free one, which is printed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

import aiohttp
import msgspec
from aiohttp import web

from cloud.app import create_app, serving
from cloud.app_keys import (
    ADMIN_TOKEN_FILE,
    BACKGROUND_TASKS,
    BROKER_ACCOUNTS,
    ENROLLED_NODES,
    INGESTOR,
    REGISTRY,
    SETTINGS,
    STORE,
)
from cloud.loop.signing import load_or_create_signing_key, public_key_base64
from cloud.main import watch_background
from cloud.store.enrolment import NewJoinToken
from cloud.summary import fleet_summary_line
from greenfed.api_client import DEFAULT_API
from greenfed.broker import DEFAULT_ADMIN_USERNAME, EmbeddedBroker
from greenfed.ports import port_is_free
from shared.redact import redact_url
from shared.runtime import run_until_stopped
from shared.settings import (
    MqttSettings,
    Settings,
    env_overrides,
    parse_mqtt_url,
    read_toml_file,
)
from shared.token_files import MalformedTokenFile, metrics_token_path, read_token_file
from shared.topics import Channel, Topics
from sim_devices.fleet import Fleet, SimNodeSpec, expand_fleet, load_sized_fleet
from sim_devices.runner import SimulatedFleet

DEFAULT_BROKER_PORT = 1883
# The embedded broker's accounts, in the data directory (mode 0600).
BROKER_ACCOUNTS_FILE = "broker-accounts.json"
# The simulated fleet's join token: long enough for a large fleet's enrolment.
ENROLMENT_TOKEN_TTL_S = 600.0
ENROLMENT_CONCURRENCY = 16
# While the fleet is coming up, and then as nodes change, at most this often.
SUMMARY_INTERVAL_S = 30.0


@dataclass(frozen=True, slots=True)
class UpOptions:
    sim_nodes: int | None
    fleet_file: Path | None
    external_mqtt_url: str | None
    broker_port: int | None
    connects_per_s: float = 200.0


def external_mqtt_url(
    settings: Settings,
    *,
    config_file: Path | None,
    mqtt_url_option: str | None,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The broker to use instead of starting the embedded one: `mqtt.url` wherever it
    was set (`--mqtt-url`, GREENFED_MQTT__URL or the config file's `[mqtt] url`), even
    to the default address a local Mosquitto listens on; None where nothing set it."""
    environ = os.environ if environ is None else environ
    file_mqtt = read_toml_file(config_file).get("mqtt", {}) if config_file is not None else {}
    given = (
        mqtt_url_option is not None
        or "url" in env_overrides(environ).get("mqtt", {})
        or (isinstance(file_mqtt, dict) and "url" in file_mqtt)
    )
    return settings.mqtt.url if given else None


@contextlib.asynccontextmanager
async def _broker(options: UpOptions, host: str, settings: Settings) -> AsyncIterator[Settings]:
    """Yield the settings to run with, starting the embedded broker if no broker was
    given: then it requires logins, the control plane holds its admin account (a fresh
    password each start) and enrols every node (`cloud.require_enrolment`)."""
    if options.external_mqtt_url:
        yield msgspec.structs.replace(
            settings, mqtt=msgspec.structs.replace(settings.mqtt, url=options.external_mqtt_url)
        )
        return
    port = options.broker_port or DEFAULT_BROKER_PORT
    if options.broker_port is None and not port_is_free(host, port):
        port = 0  # 1883 is taken (a local Mosquitto?): any free port will do
    admin_password = secrets.token_urlsafe(32)
    broker = EmbeddedBroker(
        host,
        port,
        accounts_file=settings.store.resolved_data_dir() / BROKER_ACCOUNTS_FILE,
        admin_username=DEFAULT_ADMIN_USERNAME,
        admin_password=admin_password,
    )
    async with broker:
        yield msgspec.structs.replace(
            settings,
            mqtt=msgspec.structs.replace(
                settings.mqtt,
                url=broker.url,
                username=DEFAULT_ADMIN_USERNAME,
                password=admin_password,
            ),
            cloud=msgspec.structs.replace(
                settings.cloud, broker_accounts="dynamic-security", require_enrolment=True
            ),
        )


async def _enrol_fleet(app: web.Application, api: str, fleet: Fleet) -> dict[str, MqttSettings]:
    """Each simulated node enrols as a real one does (`POST /v1/nodes/enrol` with a join
    token); a node enrolled by an earlier run gets a fresh password instead."""
    specs = expand_fleet(fleet)
    settings = app[SETTINGS]
    created = await app[STORE].create_join_token(
        NewJoinToken(ttl_s=ENROLMENT_TOKEN_TTL_S, max_uses=max(1, len(specs)))
    )
    limit = asyncio.Semaphore(ENROLMENT_CONCURRENCY)

    async def enrol(http: aiohttp.ClientSession, spec: SimNodeSpec) -> tuple[str, MqttSettings]:
        body = {
            "token": created.token,
            "node_id": spec.node_id,
            "site": spec.site,
            "zone": spec.zone,
            "region": spec.region,
            "labels": spec.labels,
        }
        async with limit, http.post(f"{api}/v1/nodes/enrol", json=body) as reply:
            if reply.status == HTTPStatus.CONFLICT:  # enrolled by an earlier `greenfed up`
                credentials = await app[BROKER_ACCOUNTS].provision(spec.node_id)
                username, password = credentials.username, credentials.password
            else:
                if reply.status != HTTPStatus.OK:
                    raise RuntimeError(
                        f"enrolling simulated node {spec.node_id} failed: "
                        f"{reply.status} {await reply.text()}"
                    )
                mqtt = (await reply.json())["mqtt"]
                username, password = mqtt["username"], mqtt["password"]
        return spec.node_id, msgspec.structs.replace(
            settings.mqtt, username=username, password=password
        )

    async with aiohttp.ClientSession() as http:
        enrolled = await asyncio.gather(*(enrol(http, spec) for spec in specs))
    return dict(enrolled)


async def _pin_sealing_keys(app: web.Application, sealing_public_keys: Mapping[str, str]) -> None:
    """Pin each enrolled simulated node to the sealing key its agent holds now, as a real
    node's `greenfed edge enrol` does (its keys are new each run, so a node enrolled by
    an earlier run is re-pinned): before the agents announce them in their births."""
    for node_id, public_key in sorted(sealing_public_keys.items()):
        if await app[STORE].pin_sealing_key(node_id, public_key):
            app[ENROLLED_NODES].enrolled(node_id, public_key)


async def run_up(settings: Settings, options: UpOptions, stop: asyncio.Event) -> int:
    fleet = load_sized_fleet(options.fleet_file, options.sim_nodes)
    async with _broker(options, "127.0.0.1", settings) as settings:
        mqtt_url = settings.mqtt.url
        app = create_app(settings)
        async with serving(app, settings.cloud.api_host, settings.cloud.api_port) as runner:
            # The port the API really bound (`--api-port 0` picks a free one).
            bound_port = runner.addresses[0][1]
            api = f"http://{settings.cloud.api_host}:{bound_port}"
            mqtt_by_node = (
                await _enrol_fleet(app, api, fleet) if settings.cloud.require_enrolment else None
            )
            simulated = SimulatedFleet(
                fleet,
                settings.mqtt,
                telemetry_interval_s=settings.agent.telemetry_interval_s,
                telemetry_jitter_ratio=settings.agent.telemetry_jitter_ratio,
                connects_per_s=options.connects_per_s,
                mqtt_by_node=mqtt_by_node,
                # The app made the key on starting: the simulated fleet trusts it.
                control_plane_public_key=public_key_base64(load_or_create_signing_key(settings)),
            )
            if mqtt_by_node is not None:
                await _pin_sealing_keys(app, simulated.sealing_public_keys)
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
    endpoint = parse_mqtt_url(mqtt_url)
    host, port = endpoint.host, endpoint.port
    # The embedded broker requires a login: a subscriber gets a read-only account of its
    # own (never the control plane's, which may do everything).
    subscribe = f"mosquitto_sub -h {host} -p {port} -t '{topics.all_nodes(Channel.TELEMETRY)}'"
    if not external and settings.mqtt.password:
        # The account may connect only with its own client id (cloud/broker_accounts/).
        login = f" -u dashboard -P PASSWORD -i {topics.reader_client_id('dashboard')} -t "
        subscribe = (
            "greenfed mqtt accounts create dashboard   (a read-only account; then "
            f"{subscribe.replace(' -t ', login)})"
        )
    lines = [
        f"greenfed up: {node_count} simulated nodes, "
        f"{'external' if external else 'embedded'} MQTT broker {redact_url(mqtt_url)}",
        f"  nodes      {api}/v1/nodes",
        f"  dashboard  {api}/ui   (sign in with the admin token, its file below)",
        f"  signals    {api}/v1/signals",
        f"  schemas    {api}/v1/schemas",
        f"  metrics    {api}/metrics   (tenants' series too with the scrape token in "
        f"{metrics_token_path(settings.store)})",
        f"  telemetry  {subscribe}",
        f"  jobs       {api}/v1/jobs   (greenfed submit FILE, greenfed jobs)",
        f"  models     {api}/v1/models   (greenfed models upload FILE.onnx)",
        f"  openapi    {api}/openapi.json",
        *_cli_lines(api),
        # Where it is, never the token itself: a terminal's scrollback and a captured
        # log are not the place for an admin credential (`cat` it where it is needed).
        f"  admin token: in {admin_token_file}{_token_note(admin_token_file)}",
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


def _token_note(path: Path) -> str:
    """Why the admin token file cannot serve, if it cannot ("" where it can)."""
    try:
        token = read_token_file(path)
    except OSError as error:
        return f" (cannot read it: {error.strerror})"
    except MalformedTokenFile as error:
        return f" (cannot serve: {error})"
    if token is None:
        return " (not there: the admin was created earlier and its token file removed)"
    return "   (the CLI reads it by itself)"


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
