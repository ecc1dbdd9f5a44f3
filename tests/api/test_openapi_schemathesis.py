"""The OpenAPI document is exact (issue 25): Schemathesis, with every check it has
(`--checks all`: status codes, content types, headers, response schemas, schema-valid
requests accepted and schema-violating ones refused, Allow on 405, authentication; all
but `use_after_free`, since DELETE cancels work and keeps it readable),
finds no disagreement between `/openapi.json` and what the API does, as the admin and
as a tenant.

Bounded for the suite: a fixed seed and a few examples per operation, both identities
at once (about 45 s on two cores). What a schema cannot say is listed, with reasons, in
tests/api/schemathesis.toml, which also says how to run it longer.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from cloud.app import create_app, serving
from cloud.app_keys import REGISTRY
from greenfed.broker import EmbeddedBroker
from shared.settings import CloudSettings, SchedulingSettings, Settings
from shared.token_files import admin_token_path, read_token_file
from tests.loop.builders import node
from tests.store.databases import sqlite_database
from tests.support.brokers import free_port
from tests.support.fleet import mqtt_settings
from tests.support.onnx_models import mlp

# Two Schemathesis runs over every operation take about 130 s alone on 2 cores, one
# CPU-minute of it; beside the rest of the suite on a loaded machine, over 180 s.
pytestmark = pytest.mark.timeout(480)

CONFIG = Path(__file__).with_name("schemathesis.toml")
SEED = 25
EXAMPLES_PER_OPERATION = 3
# One slow answer must not hang the run; every answer here takes milliseconds.
REQUEST_TIMEOUT_S = 10


@dataclass(frozen=True)
class Served:
    base_url: str
    admin_token: str
    tenant_token: str


async def _seeded(base_url: str, admin_token: str) -> str:
    """A tenant with a model, a job and a deployment (so ids resolve); its token."""
    admin = {"Authorization": f"Bearer {admin_token}"}
    async with aiohttp.ClientSession(base_url) as http:
        async with http.post("/v1/tenants", json={"name": "acme"}, headers=admin) as answer:
            assert answer.status == 201, await answer.text()
            token: str = (await answer.json())["token"]
        tenant = {"Authorization": f"Bearer {token}"}
        upload = {**tenant, "Content-Type": "application/octet-stream"}
        async with http.post("/v1/models?name=mlp", data=mlp(), headers=upload) as answer:
            assert answer.status == 201, await answer.text()
            model_id = (await answer.json())["id"]
        job = {"name": "train", "command": ["python", "train.py"]}
        deployment = {"name": "detector", "model_id": model_id, "replicas": 1}
        for path, body in (("/v1/jobs", job), ("/v1/deployments", deployment)):
            async with http.post(path, json=body, headers=tenant) as answer:
                assert answer.status == 201, await answer.text()
    return token


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    database = sqlite_database(tmp_path)
    async with EmbeddedBroker(port=0) as broker:
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        settings = Settings(
            mqtt=mqtt_settings(broker.url, "schemathesis"),
            cloud=CloudSettings(public_url=base_url, invalid_log_interval_s=60),
            store=database.settings,
            scheduling=SchedulingSettings(enabled=False),
        )
        app = create_app(settings)
        for node_id in ("gpu-1", "gpu-2"):
            app[REGISTRY].apply_status(node(node_id).status)
        async with serving(app, "127.0.0.1", port):
            admin_token = read_token_file(admin_token_path(database.settings))
            assert admin_token is not None
            yield Served(base_url, admin_token, await _seeded(base_url, admin_token))


async def schemathesis(served: Served, token: str, workdir: Path) -> tuple[int, str]:
    """Run Schemathesis as `token` against the served API; (exit status, its output)."""
    await asyncio.to_thread(workdir.mkdir)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(CONFIG),
        "--no-color",
        "run",
        f"{served.base_url}/openapi.json",
        "--checks",
        "all",
        # DELETE on a job or deployment cancels it, and it stays readable with its
        # history (docs/rest.md): not the removal this check expects. Its stateful
        # phase reached it only in some runs (cancel after a suspend, then explain).
        "--exclude-checks",
        "use_after_free",
        "--header",
        f"Authorization: Bearer {token}",
        "--seed",
        str(SEED),
        "--max-examples",
        str(EXAMPLES_PER_OPERATION),
        "--generation-database",
        "none",
        "--request-timeout",
        str(REQUEST_TIMEOUT_S),
        "--workers",
        "1",
        cwd=workdir,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace")


async def test_schemathesis_finds_no_disagreement_as_the_admin_or_as_a_tenant(
    served: Served, tmp_path: Path
) -> None:
    (admin_status, admin_output), (tenant_status, tenant_output) = await asyncio.gather(
        schemathesis(served, served.admin_token, tmp_path / "admin"),
        schemathesis(served, served.tenant_token, tmp_path / "tenant"),
    )
    for who, status, output in (
        ("admin", admin_status, admin_output),
        ("tenant", tenant_status, tenant_output),
    ):
        assert status == 0, f"schemathesis as the {who}:\n{output[-12000:]}"
        # It ran: every generated case passed, and there were cases.
        ran = re.search(r"([0-9]+) generated, \1 passed", output)
        assert ran is not None, output[-2000:]
        assert int(ran.group(1)) > 0
