"""Slurm as a place to run (issue 26), on a real Slurm 22.05 cluster on this host (two
slurmd, four A100s each declared through gres.conf, slurmdbd on MariaDB:
tests/support/slurm.py), through greenfed's REST API: an admin registers the cluster,
its machines become nodes, and jobs submitted to greenfed run under Slurm, a gang as
one Slurm job across both machines with greenfed's worker environment; a job fails
with its exit code, is cancelled (the Slurm job with it), is adopted by a restarted
control plane without being submitted twice, and keeps running while slurmctld is
down, the cluster shown unreachable and nothing resubmitted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from cloud.app_keys import CLUSTERS, REGISTRY, SETTINGS
from cloud.loop.signing import load_or_create_signing_key, public_key_base64
from tests.api.support import Api, bearer, problem, running_api
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import FAST_LOOP, RecordingLauncher, reaches
from tests.support.fleet import running, simulated_agent
from tests.support.slurm import SlurmCluster
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(300)
# The store plays no part in what is tested here.
sqlite_only = pytest.mark.parametrize("database", ["sqlite"], indirect=True)
# Grace beyond a refresh or two: a slow `scontrol` on a loaded machine loses no node.
SCHEDULING = msgspec.structs.replace(FAST_LOOP, node_lost_grace_s=10.0)
CLUSTER = "lab"


# The two ways greenfed reaches a cluster: its commands on a login node (this host), or
# its slurmrestd (rest_auth/local on a UNIX socket; Slurm 22.05's openapi/v0.0.38).
TRANSPORTS = pytest.mark.parametrize("transport", ["commands", "rest"])


def access(cluster: SlurmCluster, transport: str = "commands") -> dict[str, Any]:
    """The registration's `slurm` object for one transport."""
    if transport == "rest":
        return {"rest_url": f"unix:{cluster.restd_socket}", "work_dir": str(cluster.job_dir)}
    return {"slurm_conf": str(cluster.conf_path), "work_dir": str(cluster.job_dir)}


def registration(cluster: SlurmCluster, **extra: Any) -> dict[str, Any]:
    return {
        "name": CLUSTER,
        "zone": "DE",
        "region": "europe-west3",
        "slurm": access(cluster),
        "refresh_interval_s": 1.0,
        **extra,
    }


async def register(
    api: Api, cluster: SlurmCluster, transport: str = "commands", **extra: Any
) -> dict[str, Any]:
    extra.setdefault("slurm", access(cluster, transport))
    response = await api.client.post(
        "/v1/clusters", json=registration(cluster, **extra), headers=bearer(api.admin_token)
    )
    assert response.status == 201, await response.text()
    body: dict[str, Any] = await response.json()
    node_ids = [f"{CLUSTER}.{name}" for name in cluster.node_names]

    def online() -> bool:
        records = [api.app[REGISTRY].get(node_id) for node_id in node_ids]
        return all(record is not None and record.state == "online" for record in records)

    await eventually(online, timeout_s=30, message=lambda: f"nodes: {api.app[REGISTRY].nodes()}")
    return body


async def accounted(slurm: SlurmCluster, job_id: str, states: list[str]) -> list[dict[str, str]]:
    """greenfed's Slurm jobs of one greenfed job once `sacct` shows them in `states`
    (slurmdbd records a job a moment after slurmctld ends it)."""
    found: list[dict[str, str]] = []

    async def there() -> bool:
        found[:] = await slurm_jobs(slurm, job_id)
        return [row["state"].split()[0] for row in found] == states  # "CANCELLED by 0"

    await eventually_async(there, timeout_s=30, message=lambda: f"sacct: {found}")
    return found


async def slurm_jobs(slurm: SlurmCluster, job_id: str) -> list[dict[str, str]]:
    """greenfed's Slurm jobs of one greenfed job, as `sacct` and `scontrol` know them."""
    result = await slurm.run(
        "sacct", "-X", "-P", "-n", "-o", "JobID,JobName,State,ExitCode,NodeList"
    )
    rows = [dict(zip(("id", "name", "state", "exit", "nodes"), line.split("|"), strict=False))
            for line in result.stdout.splitlines() if line]  # fmt: skip
    return [row for row in rows if row.get("name", "").startswith(f"gf-{job_id}-")]


def job(name: str, command: list[str], **fields: Any) -> dict[str, Any]:
    return {"name": name, "command": command, "accelerators_per_worker": 1, **fields}


@sqlite_only
@TRANSPORTS
async def test_a_registered_cluster_is_nodes_and_runs_a_gang_as_one_slurm_job(
    slurm: SlurmCluster, database: DatabaseUnderTest, tmp_path: Path, transport: str
) -> None:
    out = slurm.job_dir / f"gang-{tmp_path.name}"
    async with running_api(database, scheduling=SCHEDULING) as api:
        await register(api, slurm, transport)
        for name in slurm.node_names:
            record = api.app[REGISTRY].get(f"{CLUSTER}.{name}")
            assert record is not None
            gpus = [a for a in record.status.accelerators if a.kind == "gpu"]
            assert [a.model for a in gpus] == ["NVIDIA A100-SXM4-80GB"] * slurm.gpus_per_node
            assert record.status.labels["greenfed.io/cluster"] == CLUSTER
            assert (record.status.zone, record.status.region) == ("DE", "europe-west3")
        listed = await (await api.get(api.admin_token, "/v1/clusters")).json()
        (cluster,) = listed["items"]
        assert cluster["reachable"] is True
        assert cluster["nodes"] == 2
        assert cluster["accelerators"] == {"NVIDIA A100-SXM4-80GB": 8}
        # Slurm 22.05's slurmrestd speaks only v0.0.38, which cannot name machines.
        assert (cluster["interface"], cluster["pins_machines"]) == (
            ("slurmrestd v0.0.38", False) if transport == "rest" else ("Slurm commands, here", True)
        )

        token = await api.tenant("acme")
        script = (
            'mkdir -p "$OUT"; echo "$RANK $WORLD_SIZE $LOCAL_RANK $NODE_RANK $NNODES '
            '$MASTER_ADDR $MASTER_PORT $GREENFED_JOB_ID" > "$OUT/rank-$RANK"; '
            'echo "hello from rank $RANK"'
        )
        gang = await api.submitted(
            token,
            job("gang", ["sh", "-c", script], workers=2, accelerators_per_worker=4,
                env={"OUT": str(out)}, estimated_duration_s=60),
        )  # fmt: skip
        body = await reaches(api, token, gang, "succeeded", timeout_s=90)
        assert body["reason"] == "every worker exited 0"
        (row,) = await accounted(slurm, gang, ["COMPLETED"])  # one Slurm job for the gang
        assert row["nodes"] == f"gfnode[{slurm.node_names[0][-1]}-{slurm.node_names[1][-1]}]"
        ranks = sorted((out / f"rank-{rank}").read_text().split() for rank in (0, 1))
        assert [r[:5] for r in ranks] == [["0", "2", "0", "0", "2"], ["1", "2", "0", "1", "2"]]
        assert {r[5] for r in ranks} == {slurm.node_names[0]}  # the first machine
        assert {r[7] for r in ranks} == {gang}

        # What the job printed, through `greenfed logs` (the job's output file).
        async def printed() -> bool:
            response = await api.get(token, f"/v1/jobs/{gang}/logs")
            text = await response.text()
            return "hello from rank 0" in text and "hello from rank 1" in text

        await eventually_async(printed, timeout_s=30, message="no output in the job's logs")


@sqlite_only
@TRANSPORTS
async def test_a_failing_job_fails_with_its_exit_code_and_a_cancelled_one_is_scancelled(
    slurm: SlurmCluster, database: DatabaseUnderTest, transport: str
) -> None:
    async with running_api(database, scheduling=SCHEDULING) as api:
        await register(api, slurm, slurm={**access(slurm, transport), "nice": {"p2": 50}})
        token = await api.tenant("acme")
        failing = await api.submitted(token, job("fails", ["sh", "-c", "exit 3"], max_retries=0))
        body = await reaches(api, token, failing, "failed", timeout_s=60)
        assert "exit code 3" in str(body), body
        (row,) = await accounted(slurm, failing, ["FAILED"])
        assert row["exit"] == "3:0"

        long = await api.submitted(token, job("long", ["sleep", "600"], priority="p2"))
        await reaches(api, token, long, "running", timeout_s=60)
        # The job's priority went with it: p2's nice value, as registered.
        shown = await slurm.run("scontrol", "-o", "show", "job")
        (line,) = [line for line in shown.stdout.splitlines() if f"JobName=gf-{long}-" in line]
        assert " Nice=50 " in line, line  # whole: its Priority shows what Slurm applied
        response = await api.client.delete(f"/v1/jobs/{long}", headers=bearer(token))
        assert response.status in (200, 202), await response.text()
        await reaches(api, token, long, "cancelled", timeout_s=30)

        await accounted(slurm, long, ["CANCELLED"])


@sqlite_only
@TRANSPORTS
async def test_a_restarted_control_plane_adopts_the_slurm_job_and_survives_slurmctld_down(
    slurm: SlurmCluster, database: DatabaseUnderTest, transport: str
) -> None:
    async with running_api(database, scheduling=SCHEDULING) as api:
        await register(api, slurm, transport)
        token = await api.tenant("acme")
        marker = slurm.job_dir / f"adopted-{token[-8:]}"
        long = await api.submitted(
            token,
            job("long", ["sh", "-c", f'sleep 4; touch "{marker}"; sleep 600']),
        )
        await reaches(api, token, long, "running", timeout_s=60)
    # The control plane is gone; the Slurm job runs on.
    async with running_api(database, scheduling=SCHEDULING) as api:
        await eventually(
            lambda: api.app[REGISTRY].get(f"{CLUSTER}.{slurm.node_names[0]}") is not None,
            timeout_s=30,
        )
        body = await reaches(api, token, long, "running", timeout_s=30)
        assert body["attempts"] == 1
        await eventually(marker.exists, timeout_s=30)  # the same worker, still running
        await accounted(slurm, long, ["RUNNING"])  # never submitted twice

        await slurm.stop_slurmctld()
        bridge = api.app[CLUSTERS].bridge(CLUSTER)
        assert bridge is not None
        await eventually(lambda: not bridge.health.reachable, timeout_s=30)
        cluster = await (await api.get(api.admin_token, f"/v1/clusters/{CLUSTER}")).json()
        assert cluster["reachable"] is False
        assert cluster["last_contact_at"] is not None
        record = api.app[REGISTRY].get(f"{CLUSTER}.{slurm.node_names[0]}")
        assert record is not None
        assert [t.key for t in record.status.taints] == ["greenfed.io/cluster-unreachable"]
        assert (await reaches(api, token, long, "running"))["attempts"] == 1

        await slurm.start_slurmctld()
        await eventually(lambda: bridge.health.reachable, timeout_s=60)
        assert (await reaches(api, token, long, "running"))["attempts"] == 1
        await accounted(slurm, long, ["RUNNING"])

        # Metered like any other job: the energy model's figures (the cluster measures
        # nothing greenfed can read here), flagged as such.
        usage: dict[str, Any] = {}

        async def metered() -> bool:
            usage.update((await (await api.get(token, f"/v1/jobs/{long}")).json())["usage"] or {})
            return bool(usage.get("energy_kwh"))

        await eventually_async(metered, timeout_s=60, message=lambda: f"usage: {usage}")
        assert usage["measured_share"] == 0.0
        assert usage["gco2eq_g"] > 0

        # A cluster with greenfed's work on it is not removed from under it.
        response = await api.client.delete(
            f"/v1/clusters/{CLUSTER}", headers=bearer(api.admin_token)
        )
        await problem(response, 409)


@sqlite_only
async def test_registrations_are_checked_and_admin_only(
    slurm: SlurmCluster, database: DatabaseUnderTest
) -> None:
    async with running_api(database) as api:
        tenant = await api.tenant("acme")
        for method, path in (("POST", "/v1/clusters"), ("GET", "/v1/clusters")):
            await problem(
                await api.client.request(method, path, json={}, headers=bearer(tenant)), 403
            )
        bad = registration(slurm, gres_models={"a100": "NVIDIA Imaginary 9000"})
        response = await api.client.post("/v1/clusters", json=bad, headers=bearer(api.admin_token))
        body = await problem(response, 422)
        assert body["invalid_params"][0]["name"].startswith("$.gres_models")
        relative = registration(slurm)
        relative["slurm"]["work_dir"] = "jobs"
        response = await api.client.post(
            "/v1/clusters", json=relative, headers=bearer(api.admin_token)
        )
        await problem(response, 422)
        await register(api, slurm)
        again = await api.client.post(
            "/v1/clusters", json=registration(slurm), headers=bearer(api.admin_token)
        )
        await problem(again, 409)
        removed = await api.client.delete(
            f"/v1/clusters/{CLUSTER}", headers=bearer(api.admin_token)
        )
        assert removed.status == 200, await removed.text()
        await eventually(
            lambda: not any(r.node_id.startswith(f"{CLUSTER}.") for r in api.app[REGISTRY].nodes()),
            timeout_s=10,
        )
        audit = await (
            await api.get(api.admin_token, "/v1/audit?action=cluster.add,cluster.remove")
        ).json()
        assert [e["action"] for e in audit["items"]] == ["cluster.remove", "cluster.add"]


# CA-ON's grid is among the cleanest of the shipped traces (tens of g/kWh), ZA's among
# the dirtiest (hundreds): green placement must choose by zone, cluster or agent alike.
@sqlite_only
@pytest.mark.parametrize(
    ("cluster_zone", "agent_zone", "chosen"),
    [("CA-ON", "ZA", "cluster"), ("ZA", "CA-ON", "agent")],
)
async def test_green_placement_chooses_between_a_cluster_and_an_agent_by_zone(
    slurm: SlurmCluster,
    database: DatabaseUnderTest,
    cluster_zone: str,
    agent_zone: str,
    chosen: str,
) -> None:
    async with running_api(database, scheduling=SCHEDULING) as api:
        agent = simulated_agent(
            "agent-a100",
            api.app[SETTINGS].mqtt,
            "a100-4x",
            site="cloud",
            zone=agent_zone,
            region="agent-region",
            telemetry_interval_s=0.5,
            training_launcher=RecordingLauncher("agent-a100", "a100-4x"),
            control_plane_public_key=public_key_base64(
                load_or_create_signing_key(api.app[SETTINGS])
            ),
        )
        async with running(agent):
            await eventually(lambda: api.app[REGISTRY].get("agent-a100") is not None)
            await register(api, slurm, zone=cluster_zone, region="cluster-region")
            token = await api.tenant("acme")
            work = await api.submitted(token, job("green", ["sleep", "600"]))
            body = await reaches(api, token, work, "running", timeout_s=60)
            (node,) = body["nodes"]
            assert node.startswith(f"{CLUSTER}.") == (chosen == "cluster"), body
            explained = await (await api.get(token, f"/v1/jobs/{work}/explain")).json()
            (placement,) = explained["explanation"]["placements"]

            def carbon(candidate: dict[str, Any]) -> float:
                (term,) = [t for t in candidate["terms"] if t["name"] == "carbon"]
                return float(term["value"])

            # The carbon term decided it: every node of the other kind scored worse on it.
            losers = [
                runner
                for runner in placement["runners_up"]
                if runner["node_id"].startswith(f"{CLUSTER}.") != node.startswith(f"{CLUSTER}.")
            ]
            assert losers
            assert all(carbon(placement["chosen"]) > carbon(runner) for runner in losers)
            response = await api.client.delete(f"/v1/jobs/{work}", headers=bearer(token))
            assert response.status in (200, 202), await response.text()
            await reaches(api, token, work, "cancelled", timeout_s=30)


@sqlite_only
async def test_a_job_cancelled_behind_greenfeds_back_ends_saying_so(
    slurm: SlurmCluster, database: DatabaseUnderTest
) -> None:
    async with running_api(database, scheduling=SCHEDULING) as api:
        await register(api, slurm)
        token = await api.tenant("acme")
        long = await api.submitted(token, job("long", ["sleep", "600"], max_retries=0))
        await reaches(api, token, long, "running", timeout_s=60)
        (row,) = await accounted(slurm, long, ["RUNNING"])
        await slurm.run("scancel", row["id"])  # an operator of the cluster, not greenfed
        seen: dict[str, Any] = {}

        async def ended() -> bool:
            seen.update(await (await api.get(token, f"/v1/jobs/{long}")).json())
            return bool(seen["state"] != "running")

        await eventually_async(ended, timeout_s=30, message=lambda: f"still {seen}")
        # Requeued, as a preempted worker is, with the cluster's reason in its history.
        assert seen["attempts"] == 2 or seen["state"] == "pending", seen
        reasons = [
            msgspec.json.decode(event.payload).get("reason") or ""
            for event in await api.store.list_events(tenant_id=None, limit=1000)
            if event.work_id == long and event.kind == "work.state"
        ]
        assert any("cancelled on the cluster" in reason for reason in reasons), reasons


@sqlite_only
async def test_secrets_go_only_to_a_cluster_registered_to_accept_them(
    slurm: SlurmCluster, database: DatabaseUnderTest, tmp_path: Path
) -> None:
    out = slurm.job_dir / f"secret-{tmp_path.name}"
    async with running_api(database, scheduling=SCHEDULING) as api:
        await register(api, slurm)
        token = await api.tenant("acme")
        spec = job(
            "with-secret",
            ["sh", "-c", 'echo "$API_KEY" > "$OUT"'],
            env={"OUT": str(out)},
            secret_env={"API_KEY": "s3cr3t value"},
        )
        # No node here takes secrets: refused at once, naming the field.
        response = await api.client.post("/v1/jobs", json=spec, headers=bearer(token))
        refused = await problem(response, 422)
        assert refused["invalid_params"][0]["name"] == "$.secret_env"

        removed = await api.client.delete(
            f"/v1/clusters/{CLUSTER}", headers=bearer(api.admin_token)
        )
        assert removed.status == 200, await removed.text()
        await register(api, slurm, accepts_secrets=True)
        record = api.app[REGISTRY].get(f"{CLUSTER}.{slurm.node_names[0]}")
        assert record is not None
        assert record.status.sealing_public_key is not None
        with_secret = await api.submitted(token, spec)
        await reaches(api, token, with_secret, "succeeded", timeout_s=60)
        assert out.read_text() == "s3cr3t value\n"


@sqlite_only
async def test_a_job_past_the_clusters_time_limit_fails_saying_so(
    slurm: SlurmCluster, database: DatabaseUnderTest
) -> None:
    async with running_api(database, scheduling=SCHEDULING) as api:
        access = {"slurm_conf": str(slurm.conf_path), "work_dir": str(slurm.job_dir)}
        # Slurm counts time limits in whole minutes: the shortest there is.
        await register(api, slurm, slurm={**access, "max_time_limit_s": 60})
        token = await api.tenant("acme")
        long = await api.submitted(token, job("too-long", ["sleep", "600"], max_retries=0))
        body = await reaches(api, token, long, "failed", timeout_s=200)
        assert "reached its time limit" in str(body["reason"]), body
        await accounted(slurm, long, ["TIMEOUT"])
