"""Smaller refusals that say what is wrong: an `--api` without http:// or https://,
`greenfed events --kind` of no kind of event (exit status 2, before anything is sent),
and `greenfed cancel` of a reference that names neither a job nor a deployment (it says
what was looked for, and that an id prefix needs 4 characters)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cloud.store.changes import WORK_STATE_EVENT
from cloud.store.job_control import HOLD_EVENT, UPDATED_EVENT
from cloud.usage.accountant import USAGE_EVENT
from cloud.work.lookup import MIN_PREFIX
from cloud.work.views import ROLLOUT_EVENT, SCALED_EVENT
from greenfed.cli import main
from greenfed.event_stream import EVENT_KINDS
from greenfed.work_commands import MIN_ID_PREFIX
from shared import secret_hashes
from tests.api.support import Api, job_spec, running_api
from tests.cli.test_admin_cli import Cli
from tests.store.databases import DatabaseUnderTest

pytestmark = pytest.mark.timeout(120)

EXIT_FAILURE = 1
EXIT_USAGE = 2
NOWHERE = ["--api", "http://127.0.0.1:1", "--token", "gf_x"]


def run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as usage:
        return int(usage.code or 0)


@pytest.mark.parametrize("given", ["127.0.0.1:8700", "localhost", "ftp://cloud.example.com"])
def test_an_api_that_is_no_http_url_is_a_usage_error(
    given: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["jobs", "--api", given, "--token", "gf_x"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"greenfed: --api {given!r} is not the URL of an API: ")
    assert "needs http:// or https://" in err
    assert err.count("\n") == 1


def test_greenfed_api_that_is_no_http_url_is_a_usage_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GREENFED_API", "127.0.0.1:8700")
    assert run(["jobs", "--token", "gf_x"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("greenfed: GREENFED_API '127.0.0.1:8700' is not the URL of an API")
    assert "did you mean http://127.0.0.1:8700?" in err


def test_events_of_a_kind_no_event_has_are_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["events", "--kind", "work.state,bogus", *NOWHERE]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("greenfed: --kind: no event is of kind 'bogus'; the kinds are ")
    assert "work.state" in err
    # Known kinds and the family go on to the API (here: none there, exit 1).
    assert run(["events", "--kind", "work", "--kind", "work.scaled,work.usage", *NOWHERE]) == 1
    assert "cannot reach the greenfed API" in capsys.readouterr().err


def test_the_kinds_events_takes_are_those_the_control_plane_records() -> None:
    recorded = {WORK_STATE_EVENT, HOLD_EVENT, UPDATED_EVENT, SCALED_EVENT, ROLLOUT_EVENT}
    assert set(EVENT_KINDS) == recorded | {USAGE_EVENT}


def test_the_shortest_prefix_said_is_the_apis() -> None:
    assert MIN_ID_PREFIX == MIN_PREFIX


@pytest.fixture(autouse=True)
def cheap_token_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with running_api(database) as running:
        yield running


async def test_cancel_of_nothing_says_what_it_looked_for(
    api: Api, capfd: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capfd)
    acme = await api.tenant("acme")
    job = await api.submitted(acme, job_spec(name="nightly"))
    code, _, err = await cli.run("cancel", "zzzz", token=acme)
    assert code == EXIT_FAILURE
    assert err == (
        "greenfed: no job or deployment has the id, the name or an id starting with 'zzzz'\n"
    )
    code, _, err = await cli.run("cancel", job[:3], token=acme)
    assert code == EXIT_FAILURE
    assert err == (
        f"greenfed: no job or deployment is named {job[:3]!r}, and an id prefix needs at "
        "least 4 characters\n"
    )
    assert "Deployment not found" not in err
    code, out, err = await cli.run("cancel", job[:4].lower(), token=acme)
    assert code == 0, err
    assert f"job {job[:4].lower()} cancelled" in out
