"""`greenfed apply`, `diff`, `submit --dry-run`, `events`, `--watch` and names as ids,
as people run them: separate processes against a running `greenfed cloud` (no nodes:
jobs stay queued)."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from tests.e2e.test_work_cli import Cloud, cloud  # noqa: F401 (the fixture)
from tests.support.processes import GreenfedProcess
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e


async def _tenant(cloud: Cloud) -> str:  # noqa: F811
    code, out, err = await cloud.run("tenants", "create", "acme", "--priorities", "p1,p2")
    assert code == 0, err
    match = re.search(r"token \(shown only now, keep it secret\): (\S+)", out)
    assert match is not None, out
    return match.group(1)


def _job(name: str, workers: int = 1, command: str = "train.py") -> str:
    return (
        f'kind = "training"\nname = "{name}"\ncommand = ["python", "{command}"]\n'
        f'workers = {workers}\npriority = "p2"\nallow_unschedulable = true\n'
    )


async def test_apply_a_directory_then_diff_and_change_by_name(
    cloud: Cloud,  # noqa: F811
    tmp_path: Path,
) -> None:
    token = await _tenant(cloud)
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "a.toml").write_text(_job("train-a"))
    (specs / "b.toml").write_text(_job("train-b"))
    code, out, err = await cloud.run("apply", "-f", str(specs), token=token)
    assert code == 0, err
    assert re.fullmatch(r"job train-a created: \S+\njob train-b created: \S+\n", out), out
    # Applied again: nothing new (a second job named train-a is exactly what apply avoids).
    code, out, err = await cloud.run("apply", "-f", str(specs), token=token)
    assert code == 0, err
    assert "train-a (" in out
    assert out.count("unchanged") == 2
    code, out, err = await cloud.run("jobs", "-o", "json", token=token)
    assert sorted(item["name"] for item in json.loads(out)["items"]) == ["train-a", "train-b"]

    (specs / "a.toml").write_text(_job("train-a", workers=2))
    code, out, err = await cloud.run("diff", "-f", str(specs), token=token)
    assert code == 0, err
    assert "- workers: 1\n+ workers: 2\n" in out
    assert "train-b" in out
    assert "no changes" in out
    code, out, err = await cloud.run("job", "train-a", "-o", "json", token=token)
    assert json.loads(out)["workers"] == 1  # diff changed nothing
    code, out, err = await cloud.run("apply", "-f", str(specs / "a.toml"), token=token)
    assert code == 0, err
    assert "changed: workers" in out
    assert "  workers: 1 -> 2" in out
    code, out, err = await cloud.run("job", "train-a", "-o", "json", token=token)
    assert json.loads(out)["workers"] == 2

    # How a queued job runs cannot change in place: exit 1, the message says what to do.
    (specs / "a.toml").write_text(_job("train-a", workers=2, command="other.py"))
    code, out, err = await cloud.run("apply", "-f", str(specs / "a.toml"), token=token)
    assert code == 1
    assert err.startswith("greenfed: ")
    assert "cannot change command" in err
    assert "greenfed cancel" in err
    # An invalid file is exit 2 before anything is sent.
    (specs / "c.toml").write_text(_job("train-c", workers=0))
    code, _, err = await cloud.run("apply", "-f", str(specs), token=token)
    assert code == 2
    assert "$.workers" in err

    # A pipeline from one directory: the second job waits for the first by its name.
    pipeline = tmp_path / "pipeline"
    pipeline.mkdir()
    (pipeline / "1-prep.toml").write_text(_job("prep"))
    (pipeline / "2-fit.toml").write_text(
        _job("fit") + '[[depends_on]]\njob = "prep"\ncondition = "succeeded"\n'
    )
    code, out, err = await cloud.run("apply", "-f", str(pipeline), token=token)
    assert code == 0, err
    prep_id = re.search(r"job prep created: (\S+)", out)
    assert prep_id is not None, out
    code, out, err = await cloud.run("job", "fit", "-o", "json", token=token)
    assert [link["id"] for link in json.loads(out)["waits_for"]] == [prep_id.group(1)]

    # Several specs in one YAML file, split by `---`, as kubectl reads them.
    both = tmp_path / "both.yaml"
    both.write_text(
        "kind: training\nname: yaml-a\ncommand: [python, a.py]\nallow_unschedulable: true\n"
        "---\nkind: training\nname: yaml-b\ncommand: [python, b.py]\n"
        "allow_unschedulable: true\n"
    )
    code, out, err = await cloud.run("apply", "-f", str(both), token=token)
    assert code == 0, err
    assert re.fullmatch(r"job yaml-a created: \S+\njob yaml-b created: \S+\n", out), out

    # A dry run checks and explains, and submits nothing.
    dry = tmp_path / "dry.toml"
    dry.write_text(_job("dry"))
    code, out, err = await cloud.run("submit", str(dry), "--dry-run", token=token)
    assert code == 0, err
    assert out.startswith("job dry (dry run, nothing submitted): ")
    code, out, err = await cloud.run("jobs", "-o", "json", token=token)
    assert "dry" not in [item["name"] for item in json.loads(out)["items"]]

    # Names and id prefixes wherever an id is taken; the events of it all.
    code, out, err = await cloud.run("cancel", "train-b", token=token)
    assert code == 0, err
    code, out, err = await cloud.run("events", "--kind", "work.state", token=token)
    assert code == 0, err
    assert re.search(
        r"work\.state  \S+  running|pending -> cancelled: cancelled by the tenant", out
    )
    code, out, err = await cloud.run("events", "-o", "json", "--kind", "work", token=token)
    kinds = {json.loads(line)["kind"] for line in out.splitlines()}
    assert "work.state" in kinds
    assert "work.changed" in kinds or "work.updated" in kinds


async def test_watch_redraws_on_a_state_change_and_ends_with_the_job(
    cloud: Cloud,  # noqa: F811
    tmp_path: Path,
) -> None:
    token = await _tenant(cloud)
    job = tmp_path / "job.toml"
    job.write_text(_job("watched"))
    code, _, err = await cloud.run("apply", "-f", str(job), token=token)
    assert code == 0, err
    follow = ("-f", "--since", "1h", "--kind", "work.state")
    events = GreenfedProcess(
        ["events", *follow, "--api", cloud.api, "--token", token],
        tmp_path,
        cloud.env,
    )
    watch = GreenfedProcess(
        ["job", "watched", "--watch", "--api", cloud.api, "--token", token], tmp_path, cloud.env
    )
    async with events, watch:
        # Both connected: the watch drew the job; the events caught up to its submission.
        await eventually(lambda: "pending" in watch.stdout, timeout_s=30)
        await eventually(lambda: "submitted -> pending" in events.stdout, timeout_s=30)
        code, _, err = await cloud.run("cancel", "watched", token=token)
        assert code == 0, err
        # The job ended: the watch drew it cancelled and ended by itself, status 0.
        assert await watch.wait(timeout_s=30) == 0, watch.stderr
        assert "cancelled" in watch.stdout
        await eventually(lambda: "pending -> cancelled: cancelled by the tenant" in events.stdout)
        code, _ = await events.stop(signal.SIGINT)
        assert code == 130
        assert "Traceback" not in events.stderr
