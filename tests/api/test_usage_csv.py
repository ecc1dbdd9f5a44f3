"""`GET /v1/usage?format=csv` is safe to open in a spreadsheet (issue 25): a node's zone
(free text from its birth) that reads as a formula lands escaped, as OWASP recommends,
in the tenant's export and in the admin's; every other cell is held to the same rule."""

from __future__ import annotations

import csv
import io
import time

from cloud.store import UsageHour
from cloud.store.usage import UsageWrite
from shared.csv_cells import FORMULA_LEADS, is_formula
from tests.api.support import Api, job_spec

ZONE = "=cmd|' /C calc'!A0"


async def _usage_in(api: Api, token: str, zone: str) -> str:
    """A job of the token's tenant with one hour of usage in `zone`; the job's id."""
    job_id = await api.submitted(token, job_spec())
    now = time.time()
    row = UsageHour(
        work_id=job_id, member_index=0, node_id="n1", hour_start=now - now % 3600,
        tenant_id=await api.tenant_id(token), work_kind="training", zone=zone,
        accelerator_kind="gpu", energy_j=7.2e6, measured_j=7.2e6, gap_s=0.0, gco2_g=840.0,
        cost=0.19, currency="EUR", counterfactual_gco2_g=600.0, fallback=False,
    )  # fmt: skip
    lease = await api.store.try_acquire_leadership()
    assert lease is not None
    async with lease:
        await api.store.write_usage(UsageWrite(rows=[row]), lease=lease)
    return job_id


def _cells(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


async def test_a_zone_that_reads_as_a_formula_is_escaped_in_every_export(api: Api) -> None:
    token = await api.tenant("acme")
    job_id = await _usage_in(api, token, ZONE)
    path = "/v1/usage?group_by=tenant,zone,job,day&format=csv"
    for caller in (token, api.admin_token):
        response = await api.get(caller, path)
        assert response.status == 200, await response.text()
        assert response.content_type == "text/csv"
        text = await response.text()
        # OWASP: a single quote in front, and the cell quoted.
        assert "\"'=cmd|' /C calc'!A0\"" in text
        header, *rows = _cells(text)
        assert header[:4] == ["tenant", "zone", "job", "day"]
        (row,) = rows
        assert row[:3] == ["acme", "'" + ZONE, job_id]
        # Every cell: none reads as a formula. The negative figure (the placement
        # emitted more than the baseline would have) stays a number to sum.
        for cell in (c for line in rows for c in line):
            assert not is_formula(cell), cell
        assert float(row[header.index("avoided_gco2eq_g")]) < 0
        assert not any(line.startswith(FORMULA_LEADS) for line in text.splitlines())
    # JSON is no spreadsheet: it carries the zone as it is.
    report = await (await api.get(token, "/v1/usage?group_by=zone")).json()
    assert [r["zone"] for r in report["rows"]] == [ZONE]
