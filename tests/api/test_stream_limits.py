"""Long-lived responses (events, followed logs) are bounded per tenant and in all: a
refused stream answers 429 (the tenant's share is open) or 503 (the server's), with
Retry-After, and the OpenAPI document lists both for every stream route."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from tests.api.support import FAST, bearer, job_spec, problem, running_api
from tests.store.databases import DatabaseUnderTest

STREAM_ROUTES = ("/v1/events", "/v1/jobs/{id}/logs")


async def test_a_refused_stream_says_when_to_retry_as_the_document_does(
    database: DatabaseUnderTest,
) -> None:
    tuning = dataclasses.replace(FAST, max_streams=2, max_streams_per_tenant=1)
    async with running_api(database, tuning) as api:
        document: dict[str, Any] = await (await api.client.get("/openapi.json")).json()
        acme, globex = await api.tenant("acme"), await api.tenant("globex")
        job_id = await api.submitted(acme, job_spec())
        async with asyncio.timeout(10):
            first = await api.client.get("/v1/events", headers=bearer(acme))
            assert first.status == 200
            refused = {}
            for path in ("/v1/events", f"/v1/jobs/{job_id}/logs?follow=true"):
                response = await api.client.get(path, headers=bearer(acme))
                await problem(response, 429)
                refused[path] = response.headers["Retry-After"]
            other = await api.client.get("/v1/events", headers=bearer(globex))
            assert other.status == 200
            admin = await api.client.get("/v1/events", headers=bearer(api.admin_token))
            await problem(admin, 503)
            assert int(admin.headers["Retry-After"]) > 0
        assert all(int(seconds) > 0 for seconds in refused.values())
        for path in STREAM_ROUTES:
            responses = document["paths"][path]["get"]["responses"]
            for status in ("429", "503"):
                assert "application/problem+json" in responses[status]["content"], path
                assert "Retry-After" in responses[status]["headers"], (path, status)
        first.close()
        other.close()
