"""Upgrading from the previous release, on SQLite and PostgreSQL. The previous release
is commit d1a12176e2c6 (store schema 9), the first commit of 2026-12-02: there are no
release tags yet, and its schema is five migrations behind (previous_release.py says
more; `PREVIOUS_RELEASE` there is the one place that names it).

1. Its store, as its own code made it (fixtures/, make_fixture.py), opened by today's
   start-up path (the app's `open_store`, which migrates): every old row is read and
   used through today's REST API and `Store` — tokens authenticate, queued work is
   scheduled within its tenant's quota, finished work keeps its history, usage totals
   are unchanged, join tokens, enrolled nodes, node admin records and the cluster id
   are as they were.
2. The rolling part: a replica of the previous release (its code, from this clone's
   history) that was running when today's code migrated the store goes on reading and
   writing it (old_replica.py): the migrations must be additive.

What does not hold yet is written down as strict xfails at the end of the file, with
what breaks; docs/upgrades.md tells operators how to upgrade around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cloud.app_keys import REGISTRY
from cloud.store import NewTenant, Store, open_store
from cloud.store.migrations import MIGRATIONS
from cloud.store.tenant_tokens import Authenticated
from cloud.work.convert import spec_of
from cloud.work.specs import decode_spec, encode_spec
from greenfed.cli import build_parser, main
from shared import secret_hashes
from tests.api.support import Api, job_spec, one_pass, problem, running_api
from tests.loop.builders import device, node
from tests.store.databases import DatabaseUnderTest, postgres_database, sqlite_database
from tests.store_upgrade.previous_release import (
    PREVIOUS_SCHEMA_VERSION,
    REPOSITORY,
    Backend,
    Manifest,
    extract_release,
    previous_store,
    read_manifest,
)

OLD_REPLICA = Path(__file__).with_name("old_replica.py")
MIGRATED = tuple(f"{m.version:04d}_{m.name}" for m in MIGRATIONS[PREVIOUS_SCHEMA_VERSION:])
BACKENDS = pytest.mark.parametrize("backend", ["sqlite", "postgresql"])


@pytest.fixture(autouse=True)
def cheap_token_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """scrypt at 2**10 for tokens made here; the old ones carry their own parameters."""
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)


@pytest.fixture(scope="session")
def release_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return extract_release(tmp_path_factory.mktemp("previous-release"))


# ---- 1. today's code on the previous release's store ------------------------------------


def _register_fleet(api: Api) -> None:
    """The nodes the old work ran on, and room for more, as their births would say."""
    registry = api.app[REGISTRY]
    for node_id in ("gpu-a", "gpu-b", "gpu-c"):
        registry.apply_status(node(node_id, gpus=4).status)
    registry.apply_status(node("edge-1", site="edge", devices=(device("cpu", 0),)).status)


async def _json(api: Api, token: str, path: str) -> Any:
    response = await api.get(token, path)
    assert response.status == 200, await response.text()
    return await response.json()


async def _listed(api: Api, token: str, collection: str) -> dict[str, str]:
    page = await _json(api, token, f"/v1/{collection}?limit=100")
    return {item["id"]: item["state"] for item in page["items"]}


@BACKENDS
async def test_todays_code_migrates_the_old_store_and_uses_every_old_row(
    backend: Backend, tmp_path: Path
) -> None:
    old = read_manifest(backend)
    work = old.work
    async with previous_store(backend, tmp_path) as database:
        async with running_api(database) as api:
            store = api.store
            assert (store.migrations.from_version, store.migrations.applied) == (
                PREVIOUS_SCHEMA_VERSION,
                MIGRATED,
            )

            # Every old token still authenticates (v10 moved them into tenant_tokens).
            tenants = {tenant.name: tenant for tenant in await store.list_tenants()}
            assert set(tenants) == {"admin", *old.tokens}
            for name, token in old.tokens.items():
                checked = await store.check_token(token)
                assert isinstance(checked, Authenticated), name
                assert checked.tenant.tenant_id == old.tenant_ids[name]
                (moved,) = await store.list_tokens(old.tenant_ids[name])
                assert (moved.name, moved.state(time.time())) == ("initial", "active")
            assert tenants["admin"].admin
            assert (await api.get(old.admin_token, "/v1/tokens")).status == 200

            # Quotas, cohorts and allowed priorities as they were; no caps (new in v10).
            assert dict(tenants["acme"].quotas) == {"gpu": 4}
            assert (dict(tenants["labs"].borrowing_limit), tenants["labs"].cohort) == (
                {"gpu": 2},
                "research",
            )
            assert tenants["interns"].allowed_priorities == ("p2",)
            assert (tenants["acme"].max_running, tenants["acme"].max_queued) == (None, None)

            # Each tenant sees exactly its old work, in its old states, through today's views.
            owners = {
                "acme": ("queued_a", "queued_b", "running"),
                "labs": ("succeeded", "failed"),
                "interns": ("interns_queued", "cancelled"),
            }
            for name, roles in owners.items():
                listed = await _listed(api, old.tokens[name], "jobs")
                assert listed == {work[role]: old.states[role] for role in roles}, name
            deployments = await _listed(api, old.tokens["acme"], "deployments")
            assert deployments == {work["deployment"]: "running"}
            for role, work_id in work.items():
                collection = "deployments" if role == "deployment" else "jobs"
                owner = next((n for n, roles in owners.items() if role in roles), "acme")
                shown = await _json(api, old.tokens[owner], f"/v1/{collection}/{work_id}")
                assert (shown["state"], shown["attempts"]) == (old.states[role], old.attempts[role])
                # Every field the old release stored reads back the same; new ones are defaults.
                assert {key: shown["spec"][key] for key in old.specs[role]} == old.specs[role]

            # Finished work keeps its history: reasons and the whole event log, unchanged.
            failed = await _json(api, old.tokens["labs"], f"/v1/jobs/{work['failed']}")
            assert failed["reason"] == old.state_reasons["failed"] == "exit code 3 on gpu-b"
            events = await store.list_events(tenant_id=None, limit=1000)
            assert [[e.seq, e.work_id, e.kind] for e in events] == [list(e) for e in old.events]

            # Running work keeps its allocations (power limits of v9; no CPU cores: v11).
            held = await store.work_allocations(old.tenant_ids["acme"], work["running"])
            assert [(a.node_id, a.power_limit_w, a.cpu_cores) for a in held] == [
                ("gpu-a", 250.0, 0),
                ("gpu-b", 250.0, 0),
            ]

            # Usage totals are exactly what the old release counted.
            totals = {
                (t.tenant_id, t.zone, t.currency): [t.energy_j, t.gco2_g, t.cost, t.avoided_gco2_g]
                for t in await store.usage_totals()
            }
            counted = {(t[0], t[1], t[2]): list(t[3:]) for t in old.usage_totals}
            assert totals.keys() == counted.keys()
            for key, figures in counted.items():
                assert totals[key] == pytest.approx(figures), key

            # Nodes: enrolment, admin records and the cluster id agents know stay as they were.
            enrolled = {n.node_id: n for n in await store.list_enrolled_nodes()}
            assert enrolled[old.enrolled_node].username == "node-gpu-c"
            assert enrolled[old.enrolled_node].envelope is None  # enrolled before v13
            admin_record = (await store.node_admin())["gpu-c"]
            assert admin_record.cordoned
            assert admin_record.taints == ("maintenance=true:NoSchedule",)
            assert (admin_record.approved, admin_record.trust_figures) == (None, False)
            assert await store.shared_secret("cluster-id") == old.cluster_id
            tokens = {t.token_id: t for t in await store.list_join_tokens()}
            assert tokens[old.join_tokens["redeemed"].id].uses == 1
            assert tokens[old.join_tokens["unused"].id].uses == 0

            # Old queued work is scheduled by today's loop, within its tenant's old quota:
            # acme's running job holds 2 of its 4 GPUs, so one of its 2-GPU jobs fits.
            _register_fleet(api)
            await one_pass(api)
            states = await _listed(api, old.tokens["acme"], "jobs")
            assert states[work["queued_a"]] == "scheduled"
            assert states[work["queued_b"]] == "pending"
            assert states[work["running"]] == "running"
            waiting = await _json(api, old.tokens["acme"], f"/v1/jobs/{work['queued_b']}/explain")
            assert "quota" in json.dumps(waiting)
            interns = await _listed(api, old.tokens["interns"], "jobs")
            assert interns[work["interns_queued"]] == "scheduled"

            # Old tenants submit as before, held to their old allowed priorities.
            body = await problem(
                await api.submit(old.tokens["interns"], job_spec(priority="p0")), 403
            )
            assert body["invalid_params"][0]["name"] == "$.priority"
            assert (await api.submit(old.tokens["labs"], job_spec())).status == 201

        # An old join token is still redeemable by today's enrolment (within its old TTL).
        async with _store_at(database, old.created_at + 60.0) as store:
            redemption = await store.redeem_join_token(old.join_tokens["unused"].token, "edge-9")
            assert redemption.token.uses == 1
            assert redemption.node.node_id == "edge-9"


@contextlib.asynccontextmanager
async def _store_at(database: DatabaseUnderTest, now: float) -> AsyncIterator[Store]:
    store = await open_store(database.settings, clock=lambda: now)
    try:
        yield store
    finally:
        await store.close()


def _config(database: DatabaseUnderTest, path: Path) -> Path:
    """A settings file naming the database, as `--config` takes it."""
    settings = database.settings
    lines = [f'data_dir = "{settings.data_dir}"']
    if settings.database_url:
        lines += [
            f'database_url = "{settings.database_url}"',
            f'database_schema = "{settings.database_schema}"',
        ]
    path.write_text("[store]\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def _greenfed(*argv: str) -> int:
    try:
        return main(list(argv))
    except SystemExit as usage:
        return int(usage.code or 0)


@contextlib.asynccontextmanager
async def _empty_database(backend: Backend, tmp_path: Path) -> AsyncIterator[DatabaseUnderTest]:
    if backend == "sqlite":
        yield sqlite_database(tmp_path)
        return
    async with postgres_database(tmp_path) as database:
        yield database


@BACKENDS
async def test_a_backup_taken_before_the_upgrade_restores_into_todays_version(
    backend: Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/upgrades.md's first step: today's `greenfed store backup` reads the old store
    as it is (nothing migrated), and today's `greenfed store restore` brings that file
    back, migrated, with every row (the way back when the upgrade itself went wrong)."""
    old = read_manifest(backend)
    backup = tmp_path / "before-upgrade.backup"
    async with (
        previous_store(backend, tmp_path / "source") as source,
        _empty_database(backend, tmp_path / "target") as target,
    ):
        config = _config(source, tmp_path / "source.toml")
        assert (
            await asyncio.to_thread(
                _greenfed, "store", "backup", "--config", str(config), str(backup)
            )
            == 0
        )
        assert (
            f"schema version {PREVIOUS_SCHEMA_VERSION}, cluster {old.cluster_id}"
            in capsys.readouterr().out
        )
        async with _store_at(source, time.time()) as untouched:  # the backup migrated nothing
            assert untouched.migrations.from_version == PREVIOUS_SCHEMA_VERSION

        config = _config(target, tmp_path / "target.toml")
        assert (
            await asyncio.to_thread(
                _greenfed, "store", "restore", "--config", str(config), str(backup)
            )
            == 0
        )
        said = capsys.readouterr().out
        assert f"schema version {PREVIOUS_SCHEMA_VERSION}, migrated to {len(MIGRATIONS)}" in said
        async with _store_at(target, time.time()) as restored:
            assert restored.migrations.applied == ()
            for name, token in old.tokens.items():
                tenant = await restored.authenticate(token)
                assert tenant is not None, name
                assert tenant.tenant_id == old.tenant_ids[name]
            events = await restored.list_events(tenant_id=None, limit=1000)
            assert [[e.seq, e.work_id, e.kind] for e in events] == [list(e) for e in old.events]
            for role, work_id in old.work.items():
                record = await restored.find_work(work_id)
                assert record is not None, role
                assert record.state == old.states[role], role
            assert await restored.shared_secret("cluster-id") == old.cluster_id


# ---- 2. a running replica of the previous release on the migrated store -----------------


@dataclass(frozen=True)
class RollingUpgrade:
    """What the old replica reported, and what today's code then read of its writes."""

    old: Manifest
    tree: Path
    imported_from: str  # where the old replica's `cloud.store` came from
    report: dict[str, dict[str, Any]]
    new_work_id: str
    new_tenant_id: str
    todays_view: dict[str, Any]


class _OldReplica:
    """old_replica.py in a child process on the release's code; lines prefixed with
    READY and REPORT are its protocol, anything else (its logs) is kept for errors."""

    def __init__(self, process: asyncio.subprocess.Process, stderr: Path) -> None:
        self.process = process
        self.stderr = stderr
        self.output: list[str] = []

    async def expect(self, prefix: str) -> Any:
        assert self.process.stdout is not None
        async with asyncio.timeout(30):
            while line := (await self.process.stdout.readline()).decode():
                if line.startswith(prefix + " "):
                    return json.loads(line[len(prefix) + 1 :])
                self.output.append(line)
        raise AssertionError(
            f"the old replica ended before {prefix}: {''.join(self.output)}"
            f"{self.stderr.read_text()}"
        )

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        await self.process.stdin.drain()


@contextlib.asynccontextmanager
async def _old_replica(
    tree: Path, database: DatabaseUnderTest, clock_at: float, stderr: Path
) -> AsyncIterator[_OldReplica]:
    settings = msgspec.to_builtins(database.settings)
    with stderr.open("wb") as errors:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(OLD_REPLICA),
            json.dumps({"settings": settings, "clock_at": clock_at}),
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
        )
    try:
        yield _OldReplica(process, stderr)
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def _rolling_upgrade(backend: Backend, tree: Path, scratch: Path) -> RollingUpgrade:
    old = read_manifest(backend)
    acme = old.tenant_ids["acme"]
    clock_at = old.created_at + 120.0  # the old join token's TTL has not run out
    async with (
        previous_store(backend, scratch) as database,
        _old_replica(tree, database, clock_at, scratch / "old-replica.err") as replica,
    ):
        ready = await replica.expect("READY")
        assert ready["version"] == PREVIOUS_SCHEMA_VERSION

        # Today's code starts beside it: the migration runs under the old replica.
        store = await open_store(database.settings)
        try:
            assert store.migrations.applied == MIGRATED
            newco = await store.create_tenant(NewTenant(name="newco"))
            # What today's REST layer stores for a plain job (its canonical spec).
            spec = encode_spec(decode_spec("training", json.dumps(job_spec()).encode()))
            submitted = await store.submit_work(acme, kind="training", spec=spec, priority="p1")
            await replica.send(
                {
                    "clock_at": clock_at,
                    "old_token": old.tokens["acme"],
                    "new_token": newco.token,
                    "tenant_id": acme,
                    "new_work_id": submitted.work.work_id,
                    "join_token": old.join_tokens["unused"].token,
                    "usage_hour": (old.created_at // 3600 + 1) * 3600,
                }
            )
            report = await replica.expect("REPORT")
            todays_view = await _read_old_writes(store, report, acme)
        finally:
            await store.close()
    return RollingUpgrade(
        old=old,
        tree=tree,
        imported_from=ready["imported_from"],
        report=report,
        new_work_id=submitted.work.work_id,
        new_tenant_id=newco.tenant.tenant_id,
        todays_view=todays_view,
    )


async def _read_old_writes(store: Store, report: dict[str, Any], acme: str) -> dict[str, Any]:
    """Today's code reading back what the old replica wrote (plain data: it outlives
    the database)."""
    view: dict[str, Any] = {}
    submitted = report["submit_work"].get("value")
    if submitted is not None:
        record = await store.get_work(acme, submitted)
        assert record is not None
        view["job"] = (record.state, type(spec_of(record)).__name__)
        view["allocations"] = [
            (a.node_id, a.cpu_cores, a.power_limit_w)
            for a in await store.work_allocations(acme, submitted)
        ]
    admin = (await store.node_admin()).get("gpu-old")
    view["node_admin"] = None if admin is None else (admin.cordoned, admin.trust_figures)
    enrolled = {n.node_id: n for n in await store.list_enrolled_nodes()}
    view["enrolled"] = "edge-old" in enrolled and enrolled["edge-old"].active
    view["usage_energy_j"] = sum(t.energy_j for t in await store.usage_totals())
    created = report["create_tenant"].get("value")
    if created is not None:
        view["old_tenant_listed"] = await store.get_tenant(created["tenant_id"]) is not None
        checked = await store.check_token(created["token"])
        view["old_tenant_token_works"] = isinstance(checked, Authenticated)
    return view


@pytest.fixture(scope="module")
def rolling_runs() -> dict[str, RollingUpgrade]:
    return {}


@pytest.fixture
async def rolling(
    backend: Backend,
    release_tree: Path,
    tmp_path: Path,
    rolling_runs: dict[str, RollingUpgrade],
) -> RollingUpgrade:
    """The rolling upgrade of `backend`, run once for the tests that look at it."""
    if backend not in rolling_runs:
        rolling_runs[backend] = await _rolling_upgrade(backend, release_tree, tmp_path)
    return rolling_runs[backend]


def _value(rolling: RollingUpgrade, step: str) -> Any:
    outcome = rolling.report[step]
    assert outcome["ok"], f"the old replica's {step!r} failed: {outcome['error']}"
    return outcome["value"]


@BACKENDS
def test_an_old_replica_still_running_reads_and_writes_the_migrated_store(
    rolling: RollingUpgrade,
) -> None:
    assert Path(rolling.imported_from).is_relative_to(rolling.tree)  # the release's code
    old = rolling.old
    acme = old.tenant_ids["acme"]
    # Reads: its own tokens and those today's code issues (tenants.token_id/hash stay).
    assert _value(rolling, "authenticate_old_tenant") == acme
    assert _value(rolling, "authenticate_new_tenant") == rolling.new_tenant_id
    listed = _value(rolling, "list_work")
    assert rolling.new_work_id in listed
    assert {
        work_id: listed[work_id] for work_id in (old.work["queued_a"], old.work["running"])
    } == {
        old.work["queued_a"]: "pending",
        old.work["running"]: "running",
    }
    planned = _value(rolling, "scheduling_pass_planned")
    assert planned["work"] >= 6
    # Writes into every table a migration since added columns to, leaving them out.
    assert _value(rolling, "place_run_and_meter") == ["running"]  # allocations (v11 cpu_cores)
    assert _value(rolling, "put_node_admin") is True  # node_admin (v13 approved, trust_figures)
    assert _value(rolling, "redeem_join_token") == "edge-old"  # join_tokens, enrolled_nodes
    assert _value(rolling, "create_tenant")["tenant_id"]  # tenants (v10 caps)
    # ... and today's code reads them, the columns the old code left out at their defaults.
    view = rolling.todays_view
    assert view["job"] == ("running", "TrainingJobSpec")
    assert view["allocations"] == [("gpu-old", 0, None)]
    assert view["node_admin"] == (True, False)
    assert view["enrolled"] is True
    assert view["old_tenant_listed"] is True
    usage_before = sum(total[3] for total in old.usage_totals)
    assert view["usage_energy_j"] == pytest.approx(usage_before + 1000.0)


@BACKENDS
def test_an_old_replica_that_restarts_refuses_the_migrated_store(rolling: RollingUpgrade) -> None:
    """Migrations go forward only: a restarted old replica stops with the reason instead
    of running on a schema it does not know (docs/upgrades.md: replace it with a new one)."""
    outcome = rolling.report["restart"]
    assert not outcome["ok"]
    assert outcome["error"].startswith("SchemaTooNewError: ")
    assert f"versions up to {PREVIOUS_SCHEMA_VERSION}" in outcome["error"]
    assert "upgraded by a newer greenfed" in outcome["error"]


def test_every_greenfed_command_in_the_upgrade_guide_is_real() -> None:
    """docs/upgrades.md's `greenfed` lines parse with today's command line."""
    guide = (REPOSITORY / "docs" / "upgrades.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", guide, flags=re.DOTALL)
    commands = [
        line.strip()
        for block in blocks
        for line in block.splitlines()
        if line.strip().startswith("greenfed ")
    ]
    assert len(commands) >= 5
    for command in commands:
        assert _parse(shlex.split(command)[1:]) == 0, command


def _parse(argv: list[str]) -> int:
    """argparse's verdict: 0, or its exit status (2: an unknown command or option);
    `--version` prints and exits 0."""
    try:
        build_parser().parse_args(argv)
    except SystemExit as stopped:
        return int(stopped.code or 0)
    return 0


# ---- what does not hold yet (strict: a fix turns these into failures to remove) --------


@BACKENDS
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="today's code stores every spec field, defaults included (cloud/work/specs.py "
    "encode_spec), and the previous release decodes specs with forbid_unknown_fields: it "
    "cannot read a job that a new replica accepted (unknown field `cpus_per_worker`), "
    "and its scheduling loop fails such a pending job ('its stored spec cannot be "
    "scheduled'). docs/upgrades.md: no old leader while new replicas take submissions",
)
def test_an_old_leader_schedules_work_a_new_replica_accepted(rolling: RollingUpgrade) -> None:
    assert _value(rolling, "read_spec_written_by_new_code") == "TrainingJobSpec"
    assert _value(rolling, "scheduling_pass_planned")["would_fail"] == {}


@BACKENDS
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="since v10 today's code authenticates from tenant_tokens, which the previous "
    "release never writes: a tenant it creates (or a token it rotates, in tenants."
    "token_hash) is unknown to new replicas. docs/upgrades.md: no tenant or token changes "
    "during the rollout",
)
def test_a_tenant_an_old_replica_creates_authenticates_on_new_replicas(
    rolling: RollingUpgrade,
) -> None:
    assert rolling.todays_view["old_tenant_token_works"] is True


@BACKENDS
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="the previous release authenticates with tenants.token_id/token_hash (each "
    "tenant's first token), which today's revoke_token leaves as they are: a token "
    "revoked on a new replica still works on old ones. docs/upgrades.md: no tenant or "
    "token changes during the rollout",
)
def test_a_token_revoked_on_a_new_replica_is_refused_by_old_replicas(
    rolling: RollingUpgrade,
) -> None:
    assert _value(rolling, "authenticate_revoked_token") is None
