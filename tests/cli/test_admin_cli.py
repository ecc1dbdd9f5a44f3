"""`greenfed tokens`, `greenfed audit`, `greenfed tenants [set]` and `greenfed jobs
--all-tenants|--tenant`: the real command line against the real app, both backends."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator

import pytest

from greenfed.cli import main
from shared import secret_hashes
from tests.api.support import Api, job_spec, running_api
from tests.store.databases import DatabaseUnderTest

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def cheap_token_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with running_api(database) as running:
        yield running


class Cli:
    def __init__(self, api: Api, capfd: pytest.CaptureFixture[str]) -> None:
        self.url = str(api.client.make_url("")).rstrip("/")
        self.admin = api.admin_token
        self.capfd = capfd

    async def run(self, *argv: str, token: str | None = None) -> tuple[int, str, str]:
        """The real command line, in a thread (it runs its own event loop)."""
        self.capfd.readouterr()
        args = [*argv, "--api", self.url, "--token", token or self.admin]

        def command() -> int:
            try:
                return main(args)
            except SystemExit as usage:  # argparse refusing a value
                return int(usage.code or 0)

        code = await asyncio.to_thread(command)
        out, err = self.capfd.readouterr()
        return code, out, err


def json_of(out: str) -> dict[str, object]:
    """The JSON document a `--json` command printed (the app logs to the same stdout)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("{"))
    end = next(i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("}"))
    document: dict[str, object] = json.loads("\n".join(lines[start : end + 1]))
    return document


async def test_tenants_shows_unlimited_and_set_changes_quotas_and_caps(
    api: Api, capfd: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capfd)
    code, out, err = await cli.run("tenants", "create", "acme", "--max-queued", "20")
    assert code == 0, err
    code, out, err = await cli.run("tenants", "create", "free")
    assert code == 0, err
    code, out, err = await cli.run("tenants")
    assert code == 0, err
    row = next(line for line in out.splitlines() if " free " in line)
    assert row.count("unlimited") == 3  # quotas, max running, max queued
    row = next(line for line in out.splitlines() if " acme " in line)
    assert "20" in row

    code, out, err = await cli.run(
        "tenants", "set", "acme", "--quota", "gpu=4", "--cohort", "lab", "--max-running", "2"
    )
    assert code == 0, err
    assert "tenant acme changed: quotas gpu=4, cohort lab, max running 2, max queued 20" in out
    code, out, err = await cli.run("tenants", "set", "acme", "--no-cohort", "--max-queued", "none")
    assert code == 0, err
    code, out, err = await cli.run("tenants", "--json")
    assert code == 0, err
    acme = next(t for t in json_of(out)["items"] if t["name"] == "acme")  # type: ignore[attr-defined]
    assert (acme["quotas"], acme["cohort"], acme["max_running"], acme["max_queued"]) == (
        {"gpu": 4},
        None,
        2,
        None,
    )
    assert acme["unlimited"] is False
    code, _, err = await cli.run("tenants", "set", "acme", "--max-running", "-1")
    assert code == 2
    assert "--max-running" in err


async def test_tokens_are_created_rotated_and_revoked_from_the_command_line(
    api: Api, capfd: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capfd)
    acme = await api.tenant("acme")
    code, out, err = await cli.run("tokens", "create", "ci", token=acme)
    assert code == 0, err
    made = re.search(r"token (\w+) \(ci\) of tenant acme created\n.*: (gf_\S+)", out)
    assert made is not None, out
    ci_id, ci = made.groups()
    code, out, err = await cli.run("tokens", token=ci)
    assert code == 0, err
    assert "initial" in out
    assert ci_id in out
    assert ci.split("_", 2)[2] not in out

    code, out, err = await cli.run("tokens", "rotate", ci_id, "--overlap", "0", token=ci)
    assert code == 0, err
    rotated = re.search(r"replacement (\w+)\n.*: (gf_\S+)", out)
    assert rotated is not None, out
    assert "works no more (overlap 0)" in out
    new_id, new = rotated.groups()
    code, _, err = await cli.run("jobs", token=ci)  # the old one is refused, saying why
    assert code == 3
    assert "Token revoked (401)" in err
    assert "was rotated" in err
    code, out, err = await cli.run("tokens", "revoke", new_id, token=acme)
    assert code == 0, err
    assert f"token {new_id} (ci) of tenant acme revoked" in out
    code, _, err = await cli.run("jobs", token=new)
    assert (code, "was revoked at" in err) == (3, True)

    # The admin: anyone's tokens; a tenant: not another's.
    code, out, err = await cli.run("tokens", "list", "--tenant", "acme", "--json")
    assert code == 0, err
    states = {t["id"]: t["state"] for t in json_of(out)["items"]}  # type: ignore[attr-defined]
    assert (states[ci_id], states[new_id]) == ("expired", "revoked")
    code, out, err = await cli.run("tokens", "create", "ops", "--tenant", "acme")
    assert code == 0, err
    assert "of tenant acme created" in out
    code, _, err = await cli.run("tokens", "list", "--all-tenants", token=acme)
    assert code == 3
    assert "only the admin" in err
    code, out, err = await cli.run("audit", "--action", "token.create,token.rotate,token.revoke")
    assert code == 0, err
    assert "audit: 4" in out
    assert out.count("token.create") == 2


async def test_the_admin_lists_and_cancels_every_tenants_jobs_and_the_audit_shows_it(
    api: Api, capfd: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capfd)
    acme = await api.tenant("acme")
    globex = await api.tenant("globex")
    mine = await api.submitted(acme, job_spec(name="acme-job"))
    theirs = await api.submitted(globex, job_spec(name="globex-job"))

    code, out, err = await cli.run("jobs", "--all-tenants")
    assert code == 0, err
    assert "jobs: 2" in out
    assert "tenant" in out.splitlines()[2]  # a column says whose
    assert re.search(rf"{theirs}.*globex.*globex-job", out)
    code, out, err = await cli.run("jobs", "--tenant", "acme")
    assert code == 0, err
    assert mine in out
    assert theirs not in out
    code, out, err = await cli.run("jobs", "--all-tenants", token=acme)
    assert code == 3
    assert "only the admin" in err
    code, out, err = await cli.run("jobs", token=acme)
    assert (code, mine in out, theirs in out) == (0, True, False)

    code, out, err = await cli.run("cancel", theirs)
    assert code == 0, err
    assert f"job {theirs} cancelled" in out
    code, out, err = await cli.run("job", theirs, token=globex)
    assert code == 0, err
    assert "reason: cancelled by admin admin" in out
    code, out, err = await cli.run("audit", "--since", "1h", "--actor", "admin")
    assert code == 0, err
    assert re.search(rf"admin .* work\.cancel .* {theirs}", out)
    assert "tenant globex" in out
    code, out, err = await cli.run("audit", token=acme)
    assert code == 3
