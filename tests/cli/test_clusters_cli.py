"""`greenfed clusters add|list|remove` against a running control plane, through the real
command line: options become a registration (a bad one names the option, and nothing
is sent), the listing says how the cluster is doing (here: unreachable, with why: no
Slurm answers at the slurm.conf given), and removal forgets it. The cluster itself runs
in tests/integration/test_slurm_backend.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cloud.app_keys import CLUSTERS
from tests.api.support import Api, running_api
from tests.cli.test_admin_cli import Cli, json_of
from tests.store.databases import DatabaseUnderTest
from tests.support.waiting import eventually


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with running_api(database) as running:
        yield running


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
async def test_clusters_are_added_listed_and_removed_from_the_command_line(
    api: Api, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cli = Cli(api, capfd)
    missing_conf = tmp_path / "no-such" / "slurm.conf"
    code, out, _ = await cli.run(
        "clusters", "add", "lab", "--slurm", "--zone", "CA-ON", "--region", "na-northeast2",
        "--partition", "gpu", "--partition", "fr=FR/europe-west9",
        "--slurm-conf", str(missing_conf),
        "--work-dir", "/shared/greenfed", "--qos", "p0=high", "--nice", "p2=100",
        "--gres-model", "a100_80g=NVIDIA A100-SXM4-80GB", "--json",
    )  # fmt: skip
    assert code == 0, out
    added = json_of(out)
    spec = added["spec"]
    assert isinstance(spec, dict)
    assert spec["partitions"] == {"gpu": None, "fr": {"zone": "FR", "region": "europe-west9"}}
    assert spec["slurm"]["qos"] == {"p0": "high"}
    assert spec["slurm"]["nice"] == {"p2": 100}
    assert spec["gres_models"] == {"a100_80g": "NVIDIA A100-SXM4-80GB"}

    bridge = api.app[CLUSTERS].bridge("lab")
    assert bridge is not None
    await eventually(lambda: bool(bridge.health.last_error), timeout_s=30)
    code, out, _ = await cli.run("clusters")
    assert code == 0, out
    assert "lab" in out
    assert "unreachable" in out
    assert "is not a file on this host" in bridge.health.last_error

    # A bad option is named, and nothing is registered.
    code, _, err = await cli.run(
        "clusters", "add", "other", "--slurm", "--zone", "DE", "--region", "eu",
        "--nice", "p2=lots",
    )  # fmt: skip
    assert code == 2
    assert "--nice p2=lots" in err
    code, _, err = await cli.run(
        "clusters", "add", "other", "--slurm", "--zone", "DE", "--region", "eu",
        "--gres-model", "a100=NVIDIA Imaginary",
    )  # fmt: skip
    assert code == 2
    assert "gres_models" in err
    code, _, err = await cli.run(
        "clusters", "add", "lab", "--slurm", "--zone", "DE", "--region", "eu"
    )
    assert code != 0
    assert "registered already" in err

    code, out, _ = await cli.run("clusters", "remove", "lab")
    assert code == 0, out
    assert "cluster lab removed" in out
    code, out, _ = await cli.run("clusters", "--json")
    assert json_of(out)["count"] == 0
