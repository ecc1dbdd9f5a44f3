"""`/metrics` (issue 25): the fleet's series for anyone; the series that name a tenant,
a job or a deployment only for the metrics scrape token (written owner-only to the data
directory, as the admin token is) or an admin's token. A token that is sent must be
right: a wrong one is a 401, a tenant's a 403, each a problem."""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cloud.app_keys import SCRAPE_TOKEN
from greenfed.broker import EmbeddedBroker
from shared import __version__
from shared.build import commit
from shared.token_files import metrics_token_path, read_token_file
from tests.api.support import bearer, deployment_spec, problem
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import Fleet, fleet
from tests.support.waiting import eventually_async

# Labels that name a tenant, a job or a deployment: never on an anonymous scrape.
TENANT_LABELS = frozenset({"tenant", "deployment", "job", "work_id"})


@pytest.fixture
async def running(database: DatabaseUnderTest) -> AsyncIterator[Fleet]:
    async with (
        EmbeddedBroker(port=0) as broker,
        fleet(database, (broker.url, "metrics-access"), edge_nodes=1) as running,
    ):
        yield running


def labels_by_metric(text: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


async def test_anonymous_scrapes_see_the_fleet_and_the_scrape_token_sees_tenants(
    running: Fleet, database: DatabaseUnderTest
) -> None:
    api = running.api
    token = await api.tenant("acme")
    deployment_id = await api.submitted(
        token, deployment_spec(await api.model(token), replicas=1), collection="deployments"
    )
    scrape_token = read_token_file(metrics_token_path(database.settings))
    assert scrape_token is not None
    assert scrape_token == api.app[SCRAPE_TOKEN]
    assert scrape_token.startswith("gfm_")
    mode = os.stat(metrics_token_path(database.settings)).st_mode
    assert stat.S_IMODE(mode) == 0o600  # owner-only, as the admin token

    full = ""

    async def deployment_on_metrics() -> bool:
        nonlocal full
        response = await api.client.get("/metrics", headers=bearer(scrape_token))
        assert response.status == 200, await response.text()
        full = await response.text()
        return f'deployment="{deployment_id}"' in full

    await eventually_async(
        deployment_on_metrics, timeout_s=20.0, message="the deployment never reached /metrics"
    )
    assert 'tenant="acme"' in full

    anonymous = await api.client.get("/metrics")
    assert anonymous.status == 200
    text = await anonymous.text()
    assert "acme" not in text
    assert deployment_id not in text
    for name, labels in labels_by_metric(text).items():
        assert not labels & TENANT_LABELS, (name, labels)
    # ... and it has the fleet: nodes, the scheduler, the queue, the edge node's CPU.
    fleet_series = labels_by_metric(text)
    for name in ("greenfed_nodes", "greenfed_node_up", "greenfed_scheduling_passes_total"):
        assert name in fleet_series, name
    assert 'node="orin-0"' in text
    # What runs, and how its process does, as every exporter says it.
    assert f'greenfed_build_info{{commit="{commit()}",python="' in text
    assert f'version="{__version__}"' in text
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "python_info"):
        assert name in fleet_series, name
    # Every family the anonymous scrape declares, the full one declares too.
    assert set(labels_by_metric(text)) <= set(labels_by_metric(full))

    # The admin's token is as good as the scrape token.
    admin = await api.client.get("/metrics", headers=bearer(api.admin_token))
    assert admin.status == 200
    assert f'deployment="{deployment_id}"' in await admin.text()


async def test_a_token_that_is_sent_must_be_one_that_may_see_tenants(running: Fleet) -> None:
    api = running.api
    tenant_token = await api.tenant("acme")
    forbidden = await problem(await api.client.get("/metrics", headers=bearer(tenant_token)), 403)
    assert "scrape token" in forbidden["detail"]
    for headers in (
        bearer("gfm_not-the-token"),
        bearer("gf_0000000000000000_nope"),
        {"Authorization": "Basic dXNlcjpwYXNz"},
    ):
        refused = await api.client.get("/metrics", headers=headers)
        await problem(refused, 401)
        assert refused.headers["WWW-Authenticate"].startswith("Bearer")
