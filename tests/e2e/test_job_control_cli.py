"""`greenfed hold|release|suspend|resume|requeue ID` and `greenfed patch ID` as people run
them: separate processes against a running `greenfed cloud` (no nodes: the job stays
queued), with the exit statuses docs/cli.md promises."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from tests.e2e.test_work_cli import Cloud, cloud  # noqa: F401 (the fixture)

pytestmark = pytest.mark.e2e


async def test_a_tenant_holds_changes_and_releases_a_queued_job(
    cloud: Cloud,  # noqa: F811
    tmp_path: Path,
) -> None:
    code, out, err = await cloud.run("tenants", "create", "acme", "--priorities", "p1,p2")
    assert code == 0, err
    match = re.search(r"token \(shown only now, keep it secret\): (\S+)", out)
    assert match is not None, out
    token = match.group(1)
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        'kind = "training"\nname = "resnet"\ncommand = ["python", "train.py"]\n'
        'priority = "p2"\nallow_unschedulable = true\n'
    )
    code, out, err = await cloud.run("submit", str(job_file), token=token)
    assert code == 0, err
    submitted = re.match(r"job (\S+) submitted", out)
    assert submitted is not None, out
    job_id = submitted.group(1)

    code, out, err = await cloud.run("hold", job_id, token=token)
    assert code == 0, err
    assert out == f"job {job_id} held, now pending (held): held by acme\n"
    code, out, err = await cloud.run("jobs", token=token)
    assert code == 0, err
    assert "pending (held)" in out
    code, out, err = await cloud.run("job", job_id, token=token)
    assert code == 0, err
    assert "reason: held by acme" in out

    code, out, err = await cloud.run(
        "patch", job_id, "--priority", "p1", "--workers", "2", "--window", "20:00-06:00",
        token=token,
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith(f"job {job_id} changed (priority, start_window, workers)")
    code, out, err = await cloud.run("job", job_id, "-o", "json", token=token)
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["priority"], shown["workers"], shown["hold"]) == ("p1", 2, "held")

    refusals = await asyncio.gather(
        cloud.run("patch", job_id, "--priority", "p0", token=token),
        cloud.run("patch", job_id, "--window", "25:00-06:00", token=token),
        cloud.run("patch", job_id, token=token),
        cloud.run("resume", job_id, token=token),
        cloud.run("requeue", job_id, token=token),
    )
    (forbidden, invalid, nothing, not_suspended, not_placed) = refusals
    assert forbidden[0] == 3
    assert "priority class p0 is not allowed" in forbidden[2]
    assert invalid[0] == 2
    assert "$.start_window" in invalid[2]
    assert nothing[0] == 2
    assert "nothing to change" in nothing[2]
    assert not_suspended[0] == 1
    assert f"job {job_id} is held, not suspended" in not_suspended[2]
    assert not_placed[0] == 1
    assert "only a scheduled or running job can be requeued" in not_placed[2]
    for _, _, stderr in refusals:
        assert stderr.startswith("greenfed: ")
        assert stderr.count("\n") == 1

    code, out, err = await cloud.run("release", job_id, token=token)
    assert code == 0, err
    assert out == f"job {job_id} released, now pending: released by acme\n"
