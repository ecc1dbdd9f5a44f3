"""Job arrays as people run them (issue 29): separate `greenfed` processes against a
running `greenfed cloud` (no nodes: the tasks stay queued). `greenfed submit` prints
the array's id, `greenfed jobs` lists each task as ARRAYID_INDEX, `greenfed job
ARRAYID` shows the summary and the tasks, `greenfed cancel ARRAYID_1` cancels one task
and `greenfed cancel ARRAYID` the rest; a bad range is exit status 2 naming `$.array`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.e2e.test_work_cli import Cloud, cloud  # noqa: F401 (the fixture)

pytestmark = pytest.mark.e2e

SPEC = 'kind = "training"\nname = "sweep"\ncommand = ["python", "sweep.py"]\n'


async def test_a_tenant_submits_follows_and_cancels_an_array(
    cloud: Cloud,  # noqa: F811
    tmp_path: Path,
) -> None:
    code, out, err = await cloud.run("tenants", "create", "acme")
    assert code == 0, err
    match = re.search(r"token \(shown only now, keep it secret\): (\S+)", out)
    assert match is not None, out
    token = match.group(1)

    bad = tmp_path / "bad.toml"
    bad.write_text(SPEC + 'array = "0-3%0"\n')
    code, out, err = await cloud.run("submit", str(bad), token=token)
    assert (code, out) == (2, "")
    assert err == (
        f"greenfed: invalid spec: {bad}: $.array: '0-3%0': the throttle %0 must be at least 1\n"
    )

    sweep = tmp_path / "sweep.toml"
    sweep.write_text(SPEC + 'array = "0-2%2"\nallow_unschedulable = true\n')
    code, out, err = await cloud.run("submit", str(sweep), token=token)
    assert code == 0, err
    submitted = re.match(r"job (\S+) submitted", out)
    assert submitted is not None, out
    array_id = submitted.group(1)

    code, out, err = await cloud.run("jobs", "-o", "wide", token=token)
    assert code == 0, err
    for index in range(3):
        assert f"{array_id}_{index}" in out
    code, out, err = await cloud.run("job", array_id, token=token)
    assert code == 0, err
    assert f"job {array_id}" in out
    assert "reason: array of 3 tasks: 3 pending (at most 2 placed at once)" in out
    assert "tasks: 3 (0-2%2, at most 2 at once)" in out

    code, out, err = await cloud.run("cancel", f"{array_id}_1", token=token)
    assert code == 0, err
    assert out == f"job {array_id}_1 cancelled\n"
    code, out, err = await cloud.run("job", array_id, "-o", "json", token=token)
    assert code == 0, err
    shown = json.loads(out)
    assert shown["explain"] is None
    assert [task["state"] for task in shown["array"]["tasks"]] == [
        "pending",
        "cancelled",
        "pending",
    ]

    code, out, err = await cloud.run("cancel", array_id, token=token)
    assert code == 0, err
    assert out == f"job {array_id} cancelled\n"
    code, out, err = await cloud.run("cancel", array_id, token=token)
    assert code == 1
    assert f"every task of array {array_id} has ended" in err
