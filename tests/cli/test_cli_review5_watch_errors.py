"""`greenfed job ID --watch` and `greenfed deployment ID --watch` fail as every command
does: one `greenfed: ` line and the exit status of docs/cli.md, never a traceback (a
refusal inside the watch's task group used to leave as an exception group). A watch
given a name follows the work it named when another of that name is submitted
meanwhile. The real command line against the real app, both backends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from cloud.app_keys import STREAMS
from greenfed.cli import main
from shared import secret_hashes
from tests.api.support import Api, bearer, job_spec, running_api
from tests.cli.test_admin_cli import Cli
from tests.store.databases import DatabaseUnderTest
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def cheap_token_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with running_api(database) as running:
        yield running


def assert_one_line(err: str) -> None:
    assert err.startswith("greenfed: "), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["job", "deployment"])
async def test_a_watch_of_work_that_is_not_there_is_one_line(
    api: Api, capfd: pytest.CaptureFixture[str], command: str
) -> None:
    cli = Cli(api, capfd)
    code, _, err = await asyncio.wait_for(
        cli.run(command, "01M98XXXXXXXXXXXXXXXXXXXXX", "--watch"), timeout=30
    )
    assert code == 1
    assert_one_line(err)
    assert "not found (404)" in err


async def test_a_watch_with_a_refused_token_is_one_line_and_exit_status_3(
    api: Api, capfd: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capfd)
    code, _, err = await asyncio.wait_for(
        cli.run("job", "anything", "-w", token="gf_0123456789abcdef_not-a-real-secret"), timeout=30
    )
    assert code == 3
    assert_one_line(err)
    assert "refused the token from --token" in err


@pytest.mark.parametrize("command", ["job", "deployment"])
async def test_a_watch_of_an_unreachable_api_is_one_line(
    capfd: pytest.CaptureFixture[str], command: str
) -> None:
    argv = [command, "x", "-w", "--api", "http://127.0.0.1:1", "--token", "gf_x"]  # no one on 1
    code = await asyncio.wait_for(asyncio.to_thread(main, argv), timeout=30)
    err = capfd.readouterr().err
    assert code == 1
    assert_one_line(err)
    assert "cannot reach the greenfed API at http://127.0.0.1:1 (from --api)" in err


async def test_a_watch_by_name_follows_its_work_when_another_of_the_name_comes(
    api: Api, capfd: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capfd)
    acme = await api.tenant("acme")
    first = await api.submitted(acme, job_spec(name="nightly"))
    async with asyncio.TaskGroup() as tasks:
        watching = tasks.create_task(cli.run("job", "nightly", "--watch", token=acme))
        # Its event stream is open once it has found the job it watches.
        await eventually(lambda: api.app[STREAMS].open_streams >= 1, timeout_s=30)
        second = await api.submitted(acme, job_spec(name="nightly"))  # the name: ambiguous
        cancelled = await api.client.delete(f"/v1/jobs/{first}", headers=bearer(acme))
        assert cancelled.status == 200, await cancelled.text()
        code, out, err = await asyncio.wait_for(watching, timeout=60)
    assert (code, err) == (0, "")
    assert first in out
    assert second not in out
    assert "cancelled" in out
