"""`greenfed events -o yaml`: the same data as `-o json`, through the encoder every other
command's `-o yaml` uses, each event a YAML document of its own (opened by `---`, so a
followed stream stays readable one event at a time). `wide` stays refused: a stream has
no table to widen."""

from __future__ import annotations

import importlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared import secret_hashes
from tests.api.support import Api, job_spec, running_api
from tests.cli.test_admin_cli import Cli
from tests.store.databases import DatabaseUnderTest

pytestmark = pytest.mark.timeout(120)

yaml: Any = importlib.import_module("yaml")  # untyped

EXIT_USAGE = 2


@pytest.fixture(autouse=True)
def cheap_token_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with running_api(database) as running:
        yield running


async def test_events_as_yaml_are_the_json_events_one_document_each(
    api: Api, capfd: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capfd)
    acme = await api.tenant("acme")
    await api.submitted(acme, job_spec(name="nightly"))
    code, _, err = await cli.run("cancel", "nightly", token=acme)
    assert code == 0, err

    code, as_json, err = await cli.run("events", "-o", "json", token=acme)
    assert code == 0, err
    code, as_yaml, err = await cli.run("events", "-o", "yaml", token=acme)
    assert code == 0, err  # before: "argument -o/--output: invalid choice: 'yaml'"

    expected = [json.loads(line) for line in as_json.splitlines()]
    assert len(expected) >= 2  # submitted, then cancelled
    assert as_yaml.startswith("---\n")
    assert list(yaml.safe_load_all(as_yaml)) == expected


async def test_events_take_no_wide_table(api: Api, capfd: pytest.CaptureFixture[str]) -> None:
    cli = Cli(api, capfd)
    code, _, err = await cli.run("events", "-o", "wide")
    assert code == EXIT_USAGE
    assert "invalid choice: 'wide'" in err
