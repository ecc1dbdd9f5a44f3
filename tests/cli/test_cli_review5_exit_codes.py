"""A command-line value the API refuses as invalid (a 400 or 422 problem that names the
value: `invalid-query`, `invalid-body`) is exit status 2, as one refused before sending
is (docs/cli.md "Exit status and messages"); a refusal of anything else stays 1. The
real command line against the real app, both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cloud.app_keys import REGISTRY
from shared import secret_hashes
from tests.api.support import Api, running_api
from tests.cli.test_admin_cli import Cli
from tests.loop.builders import node
from tests.store.databases import DatabaseUnderTest

pytestmark = pytest.mark.timeout(120)

EXIT_FAILURE = 1
EXIT_USAGE = 2


@pytest.fixture(autouse=True)
def cheap_token_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with running_api(database) as running:
        running.app[REGISTRY].apply_status(node("gpu-1").status)
        yield running


REFUSED_VALUES = [
    (("nodes", "set", "gpu-1", "--label", "zone=US"), "$.labels.zone: label 'zone' is well-known"),
    (("tenants", "create", "Bad!"), "$.name: "),
    (("nodes", "join-token", "create", "--ttl", "99999999d"), "$.ttl_s: "),
    (("jobs", "--state", "bogus"), "state: unknown value 'bogus'"),
    (("jobs", "--limit", "100000"), "limit: "),
    (("usage", "--by", "foo"), "group_by: unknown value 'foo'"),
]


@pytest.mark.parametrize(
    ("argv", "named"), REFUSED_VALUES, ids=[" ".join(argv) for argv, _ in REFUSED_VALUES]
)
async def test_a_value_the_api_refuses_is_a_usage_error(
    api: Api, capfd: pytest.CaptureFixture[str], argv: tuple[str, ...], named: str
) -> None:
    code, _, err = await Cli(api, capfd).run(*argv)
    assert code == EXIT_USAGE, err
    assert err.startswith("greenfed: Invalid ")
    assert named in err
    assert err.count("\n") == 1


async def test_a_file_the_api_refuses_for_what_it_holds_stays_a_failure(
    api: Api, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A model file that is no ONNX model: its content, not a value of the command line."""
    garbage = tmp_path / "bad.onnx"
    garbage.write_bytes(b"garbage")
    code, _, err = await Cli(api, capfd).run("models", "upload", str(garbage))
    assert code == EXIT_FAILURE
    assert "Not a valid ONNX model (422)" in err
