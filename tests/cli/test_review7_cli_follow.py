"""What a script may rely on from the following commands and a few small ones, as a
reviewer found them wanting. The real command line against the real app, both backends.

- `greenfed logs JOB -f` succeeds (exit status 0) only when the job has ended: a stream
  the control plane ends before (it is stopping, or the token was revoked) is a failure,
  so `greenfed logs $J -f && next` does not go on as if the job had finished;
- `greenfed events -f` has no end of its own: a stream the control plane ends is a failure;
- `--ttl inf` is refused, not sent as JSON null (the default lifetime);
- Ctrl-C in a command that does not talk to the API (`store backup`, `eval`,
  `bench scheduler`) is exit status 130 without a traceback, and leaves no partial backup;
- `greenfed edge enrol` with a refused join token says so, not that a token is missing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cloud.app import _end_streams
from cloud.app_keys import STREAMS
from cloud.store import backup as store_backup
from cloud.store.backup_file import partial_path
from greenfed.cli import main
from shared import secret_hashes
from tests.api.support import Api, bearer, job_spec, running_api
from tests.cli.test_admin_cli import Cli
from tests.cli.test_store_cli import _store_with, config
from tests.store.databases import DatabaseUnderTest
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(120)

ENDED_EARLY = (
    "greenfed: the control plane ended the log stream before the job ended "
    "(stopping, or the token was revoked)\n"
)
EVENTS_ENDED = (
    "greenfed: the control plane ended the event stream (stopping, or the token was revoked)\n"
)


@pytest.fixture(autouse=True)
def cheap_token_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with running_api(database) as running:
        yield running


async def token_of(api: Api, tenant_token: str, name: str) -> dict[str, Any]:
    """A second token of the tenant's (its id and secret), to revoke."""
    created = await api.client.post("/v1/tokens", json={"name": name}, headers=bearer(tenant_token))
    assert created.status == 201, await created.text()
    token: dict[str, Any] = await created.json()
    return token


async def revoke(api: Api, tenant_token: str, token_id: str) -> None:
    revoked = await api.client.delete(f"/v1/tokens/{token_id}", headers=bearer(tenant_token))
    assert revoked.status == 200, await revoked.text()


async def stream_open(api: Api) -> None:
    await eventually(lambda: api.app[STREAMS].open_streams >= 1, timeout_s=30)


# -- logs -f ------------------------------------------------------------------


async def test_a_followed_log_the_stopping_control_plane_ends_is_a_failure(
    api: Api, capfd: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capfd)
    acme = await api.tenant("acme")
    job = await api.submitted(acme, job_spec())  # pending: no fleet runs it
    async with asyncio.TaskGroup() as tasks:
        following = tasks.create_task(cli.run("logs", job, "-f", token=acme))
        await stream_open(api)
        await _end_streams(api.app)  # what the app does when it is stopping
        code, _, err = await asyncio.wait_for(following, timeout=30)
    assert (code, err) == (1, ENDED_EARLY)


async def test_a_followed_log_whose_token_is_revoked_is_a_failure(
    api: Api, capfd: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capfd)
    acme = await api.tenant("acme")
    ci = await token_of(api, acme, "ci")
    job = await api.submitted(acme, job_spec())
    async with asyncio.TaskGroup() as tasks:
        following = tasks.create_task(cli.run("logs", job, "-f", token=ci["token"]))
        await stream_open(api)
        await revoke(api, acme, ci["id"])
        code, _, err = await asyncio.wait_for(following, timeout=30)
    # What ended the stream is what the job's state is asked with: the refusal says why.
    assert code == 3, err
    assert err.startswith("greenfed: the API at "), err
    assert "was revoked at" in err
    assert err.count("\n") == 1


async def test_a_followed_log_by_name_ends_well_when_its_job_ends_whatever_the_name_means_then(
    api: Api, capfd: pytest.CaptureFixture[str]
) -> None:
    """The job is followed (and its end asked) by its id: by then the name it was given
    may mean another job of that name, not ended."""
    cli = Cli(api, capfd)
    acme = await api.tenant("acme")
    first = await api.submitted(acme, job_spec(name="nightly"))
    async with asyncio.TaskGroup() as tasks:
        following = tasks.create_task(cli.run("logs", "nightly", "-f", token=acme))
        await stream_open(api)
        await api.submitted(acme, job_spec(name="nightly"))
        cancelled = await api.client.delete(f"/v1/jobs/{first}", headers=bearer(acme))
        assert cancelled.status == 200, await cancelled.text()
        code, _, err = await asyncio.wait_for(following, timeout=30)
    assert (code, err) == (0, "")


# -- events -f ----------------------------------------------------------------


async def test_a_followed_event_stream_the_stopping_control_plane_ends_is_a_failure(
    api: Api, capfd: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capfd)
    async with asyncio.TaskGroup() as tasks:
        following = tasks.create_task(cli.run("events", "-f"))
        await stream_open(api)
        await _end_streams(api.app)
        code, _, err = await asyncio.wait_for(following, timeout=30)
    assert (code, err) == (1, EVENTS_ENDED)


async def test_a_followed_event_stream_whose_token_is_revoked_is_a_failure(
    api: Api, capfd: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capfd)
    acme = await api.tenant("acme")
    ci = await token_of(api, acme, "ci")
    async with asyncio.TaskGroup() as tasks:
        following = tasks.create_task(cli.run("events", "-f", token=ci["token"]))
        await stream_open(api)
        await revoke(api, acme, ci["id"])
        code, _, err = await asyncio.wait_for(following, timeout=30)
    assert (code, err) == (1, EVENTS_ENDED)


# -- --ttl --------------------------------------------------------------------


@pytest.mark.parametrize("ttl", ["inf", "1e400", "infh"])
async def test_a_join_token_lifetime_that_is_not_finite_is_refused(
    api: Api, capfd: pytest.CaptureFixture[str], ttl: str
) -> None:
    cli = Cli(api, capfd)
    code, out, err = await cli.run("nodes", "join-token", "create", "--ttl", ttl)
    assert code == 2, out
    assert "--ttl" in err
    assert "not a finite duration" in err
    response = await api.get(api.admin_token, "/v1/nodes/join-tokens")
    assert response.status == 200, await response.text()
    assert (await response.json())["items"] == []  # none was created


# -- Ctrl-C -------------------------------------------------------------------


def interrupted(*argv: str) -> int:
    """The command line, with Ctrl-C arriving while it runs (a KeyboardInterrupt that
    leaves main() would stop the test run itself: it is caught and said here)."""
    try:
        return main(list(argv))
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C left the command as a KeyboardInterrupt (a traceback)")


def control_c(*_: object, **__: object) -> None:
    raise KeyboardInterrupt


def test_ctrl_c_during_a_backup_is_130_and_leaves_no_file(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(_store_with(tmp_path / "source", "acme"))
    copy_table = store_backup._copy_table
    copied: list[str] = []

    async def copy_then_interrupted(*args: Any) -> int:
        await copy_table(*args)  # one table in the file: it has begun
        copied.append("table")
        raise KeyboardInterrupt

    monkeypatch.setattr(store_backup, "_copy_table", copy_then_interrupted)
    backup = tmp_path / "store.backup"
    capfd.readouterr()
    code = interrupted("store", "backup", "--config", str(config(tmp_path, "source")), str(backup))
    err = capfd.readouterr().err
    assert copied == ["table"]
    assert (code, err) == (130, "")
    assert not backup.exists()
    assert not partial_path(backup).exists()


def test_ctrl_c_during_an_evaluation_is_130_without_a_traceback(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cloud.eval import runner

    monkeypatch.setattr(runner, "run_eval", control_c)
    capfd.readouterr()
    code = interrupted("eval", "--days", "1", "--no-optimum", "--policies", "fifo-binpack")
    assert (code, capfd.readouterr().err) == (130, "")


def test_ctrl_c_during_the_scheduler_benchmark_is_130_without_a_traceback(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cloud.eval import scheduler_bench

    monkeypatch.setattr(scheduler_bench, "main", control_c)
    capfd.readouterr()
    code = interrupted("bench", "scheduler", "--nodes", "10", "--jobs", "10")
    assert (code, capfd.readouterr().err) == (130, "")


# -- edge enrol ---------------------------------------------------------------


async def test_enrol_with_a_refused_join_token_says_the_join_token_was_refused(
    api: Api, capfd: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))  # the node's sealing key
    url = str(api.client.make_url("")).rstrip("/")
    agent = tmp_path / "agent.toml"
    argv = ["edge", "enrol", "--api", url, "--token", "gfj_expired", "--config", str(agent)]
    capfd.readouterr()
    code = await asyncio.to_thread(main, [*argv, "--node-id", "orin-1"])
    err = capfd.readouterr().err
    assert code == 3, err
    assert err == (
        "greenfed: the join token was refused: it is unknown, expired, used up or revoked; "
        "ask an admin for a new one (greenfed nodes join-token create)\n"
    )
    assert not agent.exists()
