"""The real control-plane app (embedded broker, a store of either backend) for API tests."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer

from cloud.api.tuning import ApiTuning
from cloud.app import create_app
from cloud.app_keys import BACKGROUND_TASKS, REGISTRY, STORE
from cloud.loop.inputs import build_inputs
from cloud.loop.plans import translate
from cloud.scheduler import Plan, schedule
from cloud.store import Store
from cloud.work.explain import explanations_for_plan
from greenfed.broker import EmbeddedBroker
from shared.settings import (
    CloudSettings,
    MqttSettings,
    SchedulingSettings,
    Settings,
    UsageSettings,
)
from shared.token_files import admin_token_path, read_token_file
from tests.store.databases import DatabaseUnderTest
from tests.support.brokers import free_port
from tests.support.fleet import mqtt_settings
from tests.support.onnx_models import mlp

PROBLEM = "application/problem+json"
Client = TestClient[web.Request, web.Application]

# Streams and the event reader at test speed.
FAST = ApiTuning(
    heartbeat_s=0.2,
    event_poll_interval_s=0.2,
    log_state_poll_s=0.05,
    log_drain_s=0.2,
)


def job_spec(**fields: Any) -> dict[str, Any]:
    return {"name": "train-resnet", "command": ["python", "train.py"], **fields}


def deployment_spec(model_id: str, **fields: Any) -> dict[str, Any]:
    return {"name": "detector", "model_id": model_id, "replicas": 2, **fields}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Api:
    client: Client
    app: web.Application
    admin_token: str
    database: DatabaseUnderTest

    @property
    def store(self) -> Store:
        return self.app[STORE]

    def app_tasks(self) -> list[asyncio.Task[None]]:
        """The app's background tasks (ingestion, scheduling loop, publisher, ...)."""
        tasks: list[asyncio.Task[None]] = self.app[BACKGROUND_TASKS]
        return tasks.copy()

    async def tenant(self, name: str, **fields: Any) -> str:
        """A new tenant's token."""
        response = await self.client.post(
            "/v1/tenants", json={"name": name, **fields}, headers=bearer(self.admin_token)
        )
        assert response.status == 201, await response.text()
        token = (await response.json())["token"]
        assert isinstance(token, str)
        return token

    async def tenant_id(self, token: str) -> str:
        record = await self.store.authenticate(token)
        assert record is not None
        return record.tenant_id

    async def model(self, token: str, body: bytes | None = None, name: str = "mlp") -> str:
        """Upload a model (a small real MLP by default); its id."""
        response = await self.client.post(
            f"/v1/models?name={name}",
            data=body if body is not None else mlp(),
            headers=bearer(token) | {"Content-Type": "application/octet-stream"},
        )
        assert response.status == 201, await response.text()
        model_id = (await response.json())["id"]
        assert isinstance(model_id, str)
        return model_id

    async def submit(
        self,
        token: str,
        spec: Mapping[str, Any],
        *,
        collection: str = "jobs",
        key: str | None = None,
    ) -> ClientResponse:
        headers = bearer(token)
        if key is not None:
            headers["Idempotency-Key"] = key
        return await self.client.post(f"/v1/{collection}", json=dict(spec), headers=headers)

    async def submitted(self, token: str, spec: Mapping[str, Any], **kwargs: Any) -> str:
        response = await self.submit(token, spec, **kwargs)
        assert response.status == 201, await response.text()
        work_id = (await response.json())["id"]
        assert isinstance(work_id, str)
        return work_id

    async def get(self, token: str, path: str) -> ClientResponse:
        return await self.client.get(path, headers=bearer(token))


async def problem(response: ClientResponse, status: int) -> dict[str, Any]:
    assert response.status == status, await response.text()
    assert response.content_type == PROBLEM
    body = await response.json(content_type=PROBLEM)
    assert body["status"] == status
    assert isinstance(body, dict)
    return body


@contextlib.asynccontextmanager
async def running_api(
    database: DatabaseUnderTest,
    tuning: ApiTuning = FAST,
    *,
    mqtt: MqttSettings | None = None,
    scheduling: SchedulingSettings | None = None,
    cloud: CloudSettings | None = None,
    usage: UsageSettings | None = None,
) -> AsyncIterator[Api]:
    """The app on `mqtt` (default: an embedded broker of its own). Without `scheduling`
    the loop is off: most API tests run scheduling passes themselves, step by step."""
    async with contextlib.AsyncExitStack() as stack:
        if mqtt is None:
            broker = await stack.enter_async_context(EmbeddedBroker(port=0))
            mqtt = mqtt_settings(broker.url, "apitest")
        port = free_port()
        cloud = msgspec.structs.replace(
            cloud or CloudSettings(invalid_log_interval_s=0),
            public_url=f"http://127.0.0.1:{port}",  # agents download models from here
        )
        settings = Settings(
            mqtt=mqtt,
            cloud=cloud,
            store=database.settings,
            scheduling=scheduling or SchedulingSettings(enabled=False),
            usage=usage or UsageSettings(),
        )
        app = create_app(settings, tuning=tuning)
        async with TestClient(TestServer(app, port=port)) as client:
            admin = read_token_file(admin_token_path(database.settings))
            assert admin is not None
            yield Api(client, app, admin, database)


def encode(value: object) -> bytes:
    return msgspec.json.encode(value)


@dataclass
class ServerSentEvent:
    id: int
    event: str
    data: dict[str, Any]


class SseReader:
    """Reads a text/event-stream response message by message (comments counted apart)."""

    def __init__(self, response: ClientResponse) -> None:
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        self.response = response
        self.comments = 0
        self.retry_ms: int | None = None

    async def next(self, timeout_s: float = 5.0) -> ServerSentEvent:
        fields: dict[str, str] = {}
        data: list[str] = []
        async with asyncio.timeout(timeout_s):
            while True:
                raw = await self.response.content.readline()
                if not raw:
                    raise EOFError("the stream ended")
                line = raw.decode().rstrip("\n")
                if line.startswith(":"):
                    self.comments += 1
                    continue
                if line:
                    name, _, value = line.partition(": ")
                    if name == "data":
                        data.append(value)
                    elif name == "retry":
                        self.retry_ms = int(value)
                    else:
                        fields[name] = value
                    continue
                if data:
                    return ServerSentEvent(
                        int(fields["id"]), fields["event"], msgspec.json.decode("\n".join(data))
                    )

    async def comment(self, timeout_s: float = 5.0) -> str:
        """The next comment line (a keep-alive), skipping nothing but blank lines."""
        async with asyncio.timeout(timeout_s):
            while True:
                line = (await self.response.content.readline()).decode()
                if not line:
                    raise EOFError("the stream ended")
                if line.startswith(":"):
                    self.comments += 1
                    return line[1:].strip()
                assert not line.strip() or line.startswith("retry:"), line

    async def take(self, count: int, timeout_s: float = 5.0) -> list[ServerSentEvent]:
        return [await self.next(timeout_s) for _ in range(count)]


async def one_pass(api: Api, now: float | None = None) -> Plan:
    """One scheduling pass as the loop makes it, committed (for apps whose loop is off)."""
    store = api.store
    inputs = build_inputs(
        time.time() if now is None else now, api.app[REGISTRY].nodes(), await store.load_snapshot()
    )
    plan = schedule(inputs.snapshot)
    translation = translate(plan, inputs, explanations_for_plan(plan))
    lease = await store.try_acquire_leadership()
    assert lease is not None
    async with lease:
        await store.commit_pass(translation.write, lease=lease)
    return plan
