"""`-o table|wide|json|yaml` on every listing and show command, through the real command
line against the real app: `json` is the API's own data (and `--json` the same), `yaml`
the same data in the API's key order, `table` what it always was (the default), `wide`
that table with more columns."""

from __future__ import annotations

import importlib
import json
import re
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cloud.app_keys import CLUSTERS, REGISTRY
from cloud.store import UsageHour
from cloud.store.usage import UsageWrite
from greenfed.cli import build_parser, main
from greenfed.completion import commands_of
from shared import secret_hashes
from tests.api.support import Api, bearer, deployment_spec, job_spec, one_pass
from tests.api.test_enrolment import RecordingAccounts, enrolment_api
from tests.api.test_readmission import knock, lost_enrolment, proving_birth
from tests.cli.test_admin_cli import Cli
from tests.loop.builders import node
from tests.store.databases import DatabaseUnderTest
from tests.support.waiting import eventually

yaml: Any = importlib.import_module("yaml")

pytestmark = pytest.mark.timeout(120)
# What is printed does not depend on the store: one backend keeps it quick.
ON_SQLITE = pytest.mark.parametrize("database", ["sqlite"], indirect=True)


@pytest.fixture(autouse=True)
def quiet_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """The app's logs go to stderr (stdout is the command's), token hashing is cheap, and
    tables are as wide as a roomy terminal."""
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)
    monkeypatch.setenv("COLUMNS", "250")


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    """Enrolment required: a node that proves an enrolment the store lost is listed."""
    async with enrolment_api(database, RecordingAccounts(), require_enrolment=True) as running:
        yield running


@dataclass(frozen=True)
class Listing:
    argv: tuple[str, ...]
    api_path: str  # GET it (with the same token) for the same data
    columns: tuple[str, ...]  # its table's, as they have always been
    token: str | None = None  # default: the admin's


def header(table: str) -> list[str]:
    """The column names of the first table printed."""
    line = next(line for line in table.splitlines() if line.startswith("┃"))
    return [cell.strip() for cell in line.strip("┃").split("┃")]


def settled(text: str) -> str:
    """`3s ago` and `4s ago` are the same moment, a second apart."""
    return re.sub(r"\d+[smhd] ago", "_ ago", text)


async def api_data(api: Api, token: str, path: str) -> Any:
    response = await api.get(token, path)
    assert response.status == 200, await response.text()
    return await response.json()


async def an_hour_of_usage(api: Api, job_id: str, tenant_id: str) -> None:
    now = time.time()
    row = UsageHour(
        work_id=job_id, member_index=0, node_id="gpu-1", hour_start=now - now % 3600,
        tenant_id=tenant_id, work_kind="training", zone="DE", accelerator_kind="gpu",
        energy_j=7.2e6, measured_j=7.2e6, gap_s=0.0, gco2_g=840.0, cost=0.19, currency="EUR",
        counterfactual_gco2_g=900.0, fallback=False,
    )  # fmt: skip
    lease = await api.store.try_acquire_leadership()
    assert lease is not None
    async with lease:
        await api.store.write_usage(UsageWrite(rows=[row]), lease=lease)


async def a_busy_control_plane(api: Api, cli: Cli, tmp_path: Path) -> dict[str, str]:
    """Nodes, a tenant with a placed job and deployment, a model, an enrolled node, one
    that proves a lost enrolment, a cluster that cannot be reached: something in every
    listing. Their ids."""
    api.app[REGISTRY].apply_status(node("gpu-1", labels={"rack": "r1"}).status)
    api.app[REGISTRY].apply_status(node("orin-1", site="edge", gpus=1).status)
    key = X25519PrivateKey.generate()
    knock(api, proving_birth("edge-2", key, lost_enrolment(api, "edge-2", key)))
    acme = await api.tenant("acme", quotas={"gpu": 4})
    job = await api.submitted(acme, job_spec(name="resnet"))
    model = await api.model(acme)
    deployment = await api.submitted(
        acme, deployment_spec(model, replicas=1), collection="deployments"
    )
    await one_pass(api)
    await an_hour_of_usage(api, job, await api.tenant_id(acme))
    created = await api.client.post(
        "/v1/nodes/join-tokens",
        json={"zone": "DE", "labels": {"rack": "r2"}, "max_accelerators": {"gpu": 8}},
        headers=bearer(api.admin_token),
    )
    assert created.status == 201, await created.text()
    enrolled = await api.client.post(
        "/v1/nodes/enrol", json={"token": (await created.json())["token"], "node_id": "edge-1"}
    )
    assert enrolled.status == 200, await enrolled.text()
    code, _, err = await cli.run(
        "clusters", "add", "lab", "--slurm", "--zone", "DE", "--region", "europe-west3",
        "--slurm-conf", str(tmp_path / "no-such.conf"),
    )  # fmt: skip
    assert code == 0, err
    bridge = api.app[CLUSTERS].bridge("lab")
    assert bridge is not None
    await eventually(lambda: bool(bridge.health.last_error), timeout_s=30)
    return {"acme": acme, "job": job, "deployment": deployment}


@ON_SQLITE
async def test_every_listing_prints_each_format_from_the_apis_data(
    api: Api, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cli = Cli(api, capfd)
    made = await a_busy_control_plane(api, cli, tmp_path)
    acme = made["acme"]
    listings = [
        Listing(("nodes",), "/v1/nodes", (
            "node", "state", "site", "zone", "region", "accelerators", "isolation", "taints",
            "util %", "power W", "seen",
        )),
        Listing(("nodes", "join-token", "list"), "/v1/nodes/join-tokens", (
            "id", "state", "uses", "expires", "site", "zone", "region", "labels",
        )),
        Listing(("nodes", "enrolled"), "/v1/nodes/enrolled", (
            "node", "state", "enrolled", "join token", "broker user", "sealing key", "revoked",
        )),
        Listing(("nodes", "unenrolled"), "/v1/nodes/unenrolled", (
            "node", "state", "enrolled", "as", "now", "sealing key", "last seen",
        )),
        Listing(("clusters",), "/v1/clusters", (
            "cluster", "kind", "via", "zone", "region", "state", "nodes", "accelerators",
            "queue", "greenfed jobs",
        )),
        Listing(("jobs",), "/v1/jobs", (
            "id", "name", "state", "prio", "workers", "attempts", "submitted", "reason",
        )),
        Listing(("deployments",), "/v1/deployments", (
            "id", "name", "state", "prio", "replicas", "model", "submitted", "reason",
        )),
        Listing(("models",), "/v1/models?limit=50", (
            "id", "name", "opset", "inputs", "outputs", "size", "sha256", "uploaded",
        ), token=acme),
        Listing(("tenants",), "/v1/tenants", (
            "name", "id", "quotas", "borrowing limit", "cohort", "share", "decayed usage",
            "standing", "max running", "max queued", "priorities", "admin",
        )),
        Listing(("tokens", "list", "--tenant", "acme"), "/v1/tokens?tenant=acme", (
            "id", "tenant", "name", "state", "created", "by", "last used", "until",
        )),
        Listing(("audit",), "/v1/audit", ("at (UTC)", "actor", "action", "target", "detail")),
        Listing(("usage",), "/v1/usage?group_by=tenant", (
            "tenant", "energy", "emissions", "avoided", "cost", "measured",
        )),
    ]  # fmt: skip
    for listing in listings:
        token = listing.token or api.admin_token
        printed: dict[str, str] = {}
        for name, extra in (
            ("default", ()),
            ("table", ("-o", "table")),
            ("wide", ("-o", "wide")),
            ("json", ("-o", "json")),
            ("--json", ("--json",)),
            ("yaml", ("--output", "yaml")),
        ):
            code, out, err = await cli.run(*listing.argv, *extra, token=token)
            assert code == 0, (listing.argv, name, err)
            printed[name] = out
        what = listing.argv
        data = json.loads(printed["json"])
        assert data == await api_data(api, token, listing.api_path), what
        assert data["items" if "items" in data else "rows"], f"{what}: nothing listed"
        assert printed["--json"] == printed["json"], what
        parsed = yaml.safe_load(printed["yaml"])
        assert parsed == data, what
        assert list(parsed) == list(data), what  # the API's key order
        assert settled(printed["table"]) == settled(printed["default"]), what
        assert tuple(header(printed["table"])) == listing.columns, what
        wide = header(printed["wide"])
        assert set(listing.columns) < set(wide), what
        assert "…" not in printed["wide"], what

    # `greenfed usage` also prints the API's CSV, for spreadsheets (`--csv` the same).
    code, csv, err = await cli.run("usage", "-o", "csv")
    assert code == 0, err
    assert csv.startswith("tenant,energy_kwh,")
    assert (await cli.run("usage", "--csv"))[1] == csv


@ON_SQLITE
async def test_job_and_deployment_show_each_format(
    api: Api, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cli = Cli(api, capfd)
    made = await a_busy_control_plane(api, cli, tmp_path)
    for noun, path in (("job", "/v1/jobs/"), ("deployment", "/v1/deployments/")):
        work_id = made[noun]
        printed = {}
        for format_name in ("table", "wide", "json", "yaml"):
            code, out, err = await cli.run(noun, work_id, "-o", format_name)
            assert code == 0, (noun, format_name, err)
            printed[format_name] = out
        # The work as the API answers it, with its explanation under `explain`.
        expected = await api_data(api, api.admin_token, path + work_id)
        expected["explain"] = await api_data(api, api.admin_token, path + work_id + "/explain")
        data = json.loads(printed["json"])
        assert data == expected
        assert data["allocations"], (noun, data["explain"])
        assert yaml.safe_load(printed["yaml"]) == data
        code, default, _ = await cli.run(noun, work_id)
        assert settled(printed["table"]) == settled(default)
        assert header(printed["table"]) == [
            "member", "node", "accelerators", "state", "since", "expected end",
        ]  # fmt: skip
        assert len(header(printed["wide"])) > len(header(printed["table"]))
        assert f"version: {data['version']}" in printed["wide"]
        assert "version:" not in printed["table"]


@ON_SQLITE
async def test_commands_that_act_print_their_answer_as_json_or_yaml(
    api: Api, capfd: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capfd)
    api.app[REGISTRY].apply_status(node("gpu-1").status)
    code, out, err = await cli.run("nodes", "cordon", "gpu-1", "-o", "yaml")
    assert code == 0, err
    cordoned = yaml.safe_load(out)
    assert (cordoned["node_id"], cordoned["cordoned"]) == ("gpu-1", True)
    code, out, err = await cli.run("nodes", "uncordon", "gpu-1", "--json")
    assert code == 0, err
    assert json.loads(out)["cordoned"] is False
    code, out, err = await cli.run("tenants", "create", "acme", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["token"].startswith("gf_")
    code, out, err = await cli.run("nodes", "cordon", "gpu-1")
    assert code == 0, err
    assert out.startswith("node gpu-1 cordoned")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["jobs", "-o", "xml"], "argument -o/--output: invalid choice: 'xml'"),
        (["cancel", "some-id", "-o", "wide"], "argument -o/--output: invalid choice: 'wide'"),
        (
            ["jobs", "--json", "-o", "yaml"],
            "argument -o/--output: not allowed with argument --json",
        ),
        (["usage", "--csv", "--json"], "argument --json: not allowed with argument --csv"),
    ],
)
def test_a_format_argparse_does_not_know_is_a_usage_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_guide_names_commands_that_take_wide() -> None:
    """docs/cli.md's table of what `-o wide` adds names commands that take it."""
    text = (Path(__file__).resolve().parents[2] / "docs/cli.md").read_text(encoding="utf-8")
    section = text.split("What `wide` adds to each listing:")[1].split("\n\n")[1]
    documented = [
        re.sub(r" [A-Z]+$", "", name.removeprefix("greenfed "))  # `greenfed job ID`: job
        for row in section.splitlines()[2:]
        for name in re.findall(r"`(greenfed [^`]+)`", row.split("|")[1])
    ]
    wide = {
        command.path
        for command in commands_of(build_parser())
        for option in command.options
        if "--output" in option.flags and "wide" in option.choices
    }
    assert len(documented) >= 13
    assert [name for name in documented if name not in wide] == []
