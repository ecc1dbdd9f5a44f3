"""What the cluster bridge (cloud/clusters/bridge.py) and its Slurm back-ends believe of
a shared cluster: another user's job that takes greenfed's name and comment never stands
in for greenfed's (before or after a restart); an ended job's last measured energy is
never billed to the GPU's next tenant; one malformed record, or an absurd count, neither
stops the bridge nor stalls the event loop; and per-job bookkeeping does not grow for
ever. The cluster is faked (tests/integration/test_slurm_backend.py runs a real one)."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import time
from typing import Any

import pytest

from cloud.clusters.backend import MAX_ACCELERATORS_PER_NODE, ClusterJob, ClusterNode
from cloud.clusters.bridge import UNREACHABLE_TAINT, ClusterBridge, ClusterPlacement
from cloud.clusters.slurm.backend import SlurmBackend
from cloud.clusters.slurm.commands import SlurmAccess, SlurmCommands
from cloud.clusters.slurm.records import (
    MAX_HOSTLIST_NAMES,
    expand_hostlist,
    gres_counts,
    jobs_of,
    nodes_of,
)
from cloud.clusters.slurm.rest_backend import SlurmRestBackend, account_identity
from cloud.clusters.slurm.rest_client import SlurmRestAccess, SlurmRestClient
from cloud.clusters.slurm.script import SubmitOptions
from cloud.fleet.registry import NodeRegistry
from shared.messages import DesiredState, DesiredTraining, Telemetry
from tests.cloud.test_cluster_bridge import MemoryCluster
from tests.cloud.test_slurm_trust import gang

VICTIM = "01HVVVVVVVVVVVVVVVVVVVVVVV"  # a tenant's job, attempt 1
OTHER = "01HWWWWWWWWWWWWWWWWWWWWWWW"  # the next tenant's, on the same GPU
GREENFED_UID = 1001
NODE_LINE = (
    "NodeName=n1 Arch=x86_64 CPUTot=8 RealMemory=65536 Gres=gpu:a100:4 "
    "AllocTRES=cpu=1,gres/gpu=1 State=MIXED Partitions=gpu"
)


def entry(job_id: str = VICTIM, tenant: str = "acme", ids: tuple[str, ...] = ("gpu0",)) -> Any:
    return DesiredTraining(
        job_id=job_id, attempt=1, tenant=tenant, command=("train",), accelerator_ids=ids,
        node_rank=0, nodes=1, world_size=1,
    )  # fmt: skip


def document(*entries: DesiredTraining, generation: int = 1) -> DesiredState:
    return DesiredState(
        node_id="lab.n1", generation=generation, issued_at=1.0, cluster_id="c1", training=entries
    )


def bridge_of(backend: Any, registry: NodeRegistry, **options: Any) -> ClusterBridge:
    return ClusterBridge("lab", backend, registry, ClusterPlacement("DE", "eu"), **options)


def state_of(registry: NodeRegistry) -> tuple[str, int | None]:
    record = registry.get("lab.n1")
    assert record is not None
    assert record.reported is not None
    (reported,) = record.reported.training
    return reported.state, reported.exit_code


def one_node_cluster() -> MemoryCluster:
    cluster = MemoryCluster()
    cluster.nodes = [ClusterNode("n1", ("gpu",), 8, 64 << 30, {"a100": 4}, {})]
    return cluster


# ---- 1: another user's job of greenfed's name and comment ----------------------------


def scontrol_job(backend_id: str, user: str, state: str, exit_code: str = "0:0") -> str:
    output = f"/shared/gf/gf-{VICTIM}-1-{backend_id}.out"
    return (
        f"JobId={backend_id} JobName=gf-{VICTIM}-1 UserId={user} JobState={state} "
        f"Reason=None ExitCode={exit_code} SubmitTime=1699990000 StartTime=1699990001 "
        f"EndTime=1700090001 NodeList=n1 Command=(null) WorkDir=/x "
        f"Comment=greenfed:{VICTIM}:1:acme StdErr={output} StdIn=/dev/null StdOut={output}"
    )


class SharedCluster(SlurmCommands):
    """Slurm's commands on a cluster greenfed shares with other users (`scontrol` lists
    every user's jobs); greenfed's account is uid 1001."""

    def __init__(self) -> None:
        super().__init__(SlurmAccess())
        self.show_job = ""
        self.calls: list[tuple[str, ...]] = []

    async def run(self, *argv: str, stdin: bytes | None = None) -> str:
        self.calls.append(argv)
        if argv == ("id", "-u"):
            return f"{GREENFED_UID}\n"
        if argv[:4] == ("scontrol", "-o", "show", "node"):
            return NODE_LINE
        if argv[:4] == ("scontrol", "-o", "show", "job"):
            return self.show_job
        if argv[0] == "sbatch":
            return "100;lab\n"
        return ""


async def test_a_foreign_job_of_the_same_name_never_stands_in_for_the_submitted_one() -> None:
    # The back-end lists a newer job of the attempt's name (a user faking greenfed's
    # name and comment, where a back-end cannot tell owners apart): greenfed tracks the
    # job it submitted, whatever the other's state.
    cluster = one_node_cluster()
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(cluster, registry)
    bridge.accept(document(entry()))
    await bridge.step()
    await bridge.step()
    (submitted,) = cluster.jobs_held
    cluster.jobs_held["9999"] = ClusterJob(
        "9999", VICTIM, 1, "failed", exit_code=3, nodes=("n1",), finished_at=time.time()
    )
    for _ in range(3):
        await bridge.step()
        job = bridge.job_of(VICTIM, 1)
        assert job is not None
        assert job.backend_id == submitted
        assert state_of(registry) == ("running", None)


async def test_scontrol_jobs_of_another_account_are_never_greenfeds() -> None:
    slurm = SharedCluster()
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(SlurmBackend(slurm, SubmitOptions(work_dir="/shared/gf")), registry)
    await bridge.step()
    bridge.accept(document(entry()))
    await bridge.step()  # submitted: Slurm job 100
    slurm.show_job = scontrol_job("100", f"greenfed({GREENFED_UID})", "RUNNING")
    await bridge.step()
    assert state_of(registry) == ("running", None)
    # eve: sbatch --job-name=gf-<victim>-1 --comment=greenfed:<victim>:1:acme --wrap 'exit 3'
    eve = scontrol_job("101", "eve(1002)", "FAILED", exit_code="3:0")
    slurm.show_job += "\n" + eve
    await bridge.step()
    job = bridge.job_of(VICTIM, 1)
    assert job is not None
    assert job.backend_id == "100"
    assert state_of(registry) == ("running", None)
    # The account's own accounting only, even for an operator account sacct would
    # answer with everyone's.
    sacct = [call for call in slurm.calls if call[0] == "sacct" and "-S" in call]
    assert sacct
    assert all(f"--user={GREENFED_UID}" in call for call in sacct)
    assert slurm.calls.count(("id", "-u")) == 1  # learned once

    # A restarted control plane: the new bridge adopts greenfed's own job, not eve's.
    restarted_slurm = SharedCluster()
    restarted_slurm.show_job = slurm.show_job
    restarted_registry = NodeRegistry(max_nodes=10)
    restarted = bridge_of(
        SlurmBackend(restarted_slurm, SubmitOptions(work_dir="/shared/gf")), restarted_registry
    )
    await restarted.step()
    restarted.accept(document(entry()))
    for _ in range(2):
        await restarted.step()
        job = restarted.job_of(VICTIM, 1)
        assert job is not None
        assert job.backend_id == "100"
        assert state_of(restarted_registry) == ("running", None)

    # Only eve's is left (greenfed's aged out): it is not adopted as the attempt's.
    alone_slurm = SharedCluster()
    alone_slurm.show_job = eve
    alone = SlurmBackend(alone_slurm, SubmitOptions(work_dir="/shared/gf"))
    assert await alone.jobs() == ()


def test_scontrol_records_are_kept_by_their_owners_uid() -> None:
    ours = scontrol_job("100", "greenfed(1001)", "RUNNING")
    listing = "\n".join(
        [
            ours,
            scontrol_job("101", "eve(1002)", "RUNNING"),
            scontrol_job("102", "greenfed(1002)", "RUNNING"),  # a name is not an account
            scontrol_job("103", "1001", "RUNNING"),
            ours.replace("UserId=greenfed(1001) ", "").replace("JobId=100", "JobId=104"),
        ]
    )
    assert [job.backend_id for job in jobs_of(listing, account_uid=1001)] == ["100"]


def rest_job(job_id: int, user_id: int, user_name: str, state: str) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "name": f"gf-{VICTIM}-1",
        "comment": f"greenfed:{VICTIM}:1:acme",
        "job_state": state,
        "state_reason": "None",
        "user_id": user_id,
        "user_name": user_name,
        "nodes": "n1",
        "exit_code": 0,
    }


class AnsweringClient(SlurmRestClient):
    """slurmrestd v0.0.38 answering from memory, every user's jobs in its listings."""

    def __init__(self, access: SlurmRestAccess) -> None:
        super().__init__(access)
        self.live: list[dict[str, Any]] = []
        self.accounted: list[dict[str, Any]] = []
        self.posted = 0

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        if path.endswith("/nodes"):
            return {"nodes": []}
        if path.startswith("/slurmdb/"):
            return {"jobs": self.accounted}
        if path.endswith("/jobs"):
            return {"jobs": self.live}
        if path.endswith("/job/submit"):
            self.posted += 1
            return {"job_id": 500}
        return {}


async def test_slurmrestd_jobs_of_another_account_are_never_greenfeds() -> None:
    # rest_auth/local: slurmrestd acts as the socket's peer, this process's account.
    own_uid = os.getuid()
    client = AnsweringClient(SlurmRestAccess(url="unix:/run/slurmrestd.socket"))
    own_name = account_identity(client.access).name  # type: ignore[union-attr]
    client.live = [rest_job(101, own_uid + 1, "eve", "FAILED")]
    client.accounted = [
        {
            **rest_job(102, own_uid + 1, "eve", "FAILED"),
            "user": "eve",
            "state": {"current": "FAILED"},
        }
    ]
    backend = SlurmRestBackend(client, SubmitOptions(work_dir="/shared/gf"), version="v0.0.38")
    assert await backend.jobs() == ()
    # Its submission is not adopted from eve's job of the same name: greenfed submits.
    assert await backend.submit(gang(job_id=VICTIM)) == "500"
    assert client.posted == 1
    client.live.append(rest_job(500, own_uid, own_name, "RUNNING"))
    client.accounted.append(
        {
            **rest_job(400, own_uid, own_name, "X"),
            "user": own_name,
            "state": {"current": "COMPLETED"},
        }
    )
    found = await backend.jobs()
    assert [(job.backend_id, job.state) for job in found] == [("500", "running")] + (
        [("400", "succeeded")] if own_name else []
    )


def jwt(payload: dict[str, Any]) -> str:
    body = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJIUzI1NiJ9.{body}.c2lnbmF0dXJl"


def test_slurmrestd_account_is_the_user_name_or_the_tokens() -> None:
    named = account_identity(SlurmRestAccess(url="https://l:6820", user_name="gf", token="x"))
    assert named is not None
    assert (named.uid, named.name) == (None, "gf")
    from_token = account_identity(SlurmRestAccess(url="https://l:6820", token=jwt({"sun": "gf2"})))
    assert from_token is not None
    assert from_token.name == "gf2"
    assert account_identity(SlurmRestAccess(url="https://l:6820", token="not-a-jwt")) is None
    assert from_token.owns_live({"user_id": 5, "user_name": "gf2"})
    assert not from_token.owns_live({"user_id": 5, "user_name": "eve"})
    assert not from_token.owns_accounted({"user": "eve"})


async def test_slurmrestd_whose_account_cannot_be_told_lists_no_job_as_greenfeds() -> None:
    client = AnsweringClient(SlurmRestAccess(url="https://login1:6820"))
    client.live = [rest_job(101, 0, "root", "RUNNING")]
    backend = SlurmRestBackend(client, SubmitOptions(work_dir="/shared/gf"), version="v0.0.38")
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(backend, registry)
    await bridge.step()
    assert not bridge.health.reachable
    assert "cannot tell greenfed's jobs from other users'" in bridge.health.last_error


# ---- 2: an ended job's last energy is not the next tenant's --------------------------


async def test_an_ended_jobs_final_energy_is_never_billed_to_the_gpus_next_tenant() -> None:
    cluster = one_node_cluster()
    registry = NodeRegistry(max_nodes=10)
    samples: list[Telemetry] = []
    clock = [1000.0]
    bridge = bridge_of(
        cluster, registry, clock=lambda: clock[0], telemetry_listeners=(samples.append,)
    )

    async def step(after_s: float = 5.0) -> None:
        clock[0] += after_s
        await bridge.step()

    def gpu0_j() -> float | None:
        latest = [s for s in samples if s.node_id == "lab.n1"][-1]
        return next(a.energy_j for a in latest.accelerators if a.id == "gpu0")

    await step()
    bridge.accept(document(entry(tenant="x")))
    await step()
    (first,) = cluster.jobs_held
    for reading_j in (1000.0, 13000.0):  # measured while it runs (400 W for 30 s)
        cluster.jobs_held[first] = dataclasses.replace(
            cluster.jobs_held[first], consumed_energy_j=reading_j
        )
        await step(30.0)
    assert gpu0_j() == 12000.0
    # It ends; scontrol shows no energy for it, and tenant y's job gets gpu0.
    cluster.jobs_held[first] = dataclasses.replace(
        cluster.jobs_held[first], state="succeeded", consumed_energy_j=None, finished_at=clock[0]
    )
    await step()
    bridge.accept(document(entry(OTHER, tenant="y"), generation=2))
    await step(40.0)
    assert gpu0_j() == 12000.0
    # The first job's final reading arrives from the history: not gpu0's any more.
    cluster.jobs_held[first] = dataclasses.replace(
        cluster.jobs_held[first], consumed_energy_j=25000.0
    )
    await step()
    await step()
    assert gpu0_j() == 12000.0


# ---- 3: malformed records and absurd counts ------------------------------------------


def test_a_host_list_that_is_no_host_list_or_too_long_yields_no_names() -> None:
    assert expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_hostlist("n[a-b]") == []
    assert expand_hostlist("n[3-1]") == []
    assert expand_hostlist("n[1-" + "9" * 5000 + "]") == []
    started = time.monotonic()
    assert expand_hostlist("n[0-3000000]") == []
    assert expand_hostlist(",".join(f"a[0-{MAX_HOSTLIST_NAMES - 1}]" for _ in range(3))) == []
    assert time.monotonic() - started < 1.0
    assert len(expand_hostlist(f"n[1-{MAX_HOSTLIST_NAMES}]")) == MAX_HOSTLIST_NAMES


def test_one_malformed_record_leaves_the_others_read() -> None:
    good = scontrol_job("100", "greenfed(1001)", "RUNNING")
    odd_hosts = scontrol_job("101", "greenfed(1001)", "RUNNING").replace(
        "NodeList=n1", "NodeList=n[a-b]"
    )
    odd_exit = scontrol_job("102", "greenfed(1001)", "FAILED", exit_code="9" * 5000 + ":0")
    jobs = jobs_of("\n".join([odd_exit, odd_hosts, good]), account_uid=1001)
    # The job with no readable host list is still read, without its machines.
    assert [(job.backend_id, job.nodes) for job in jobs] == [("101", ()), ("100", ("n1",))]
    nodes = nodes_of("NodeName=bad CPUTot=abc RealMemory=1\n" + NODE_LINE)
    assert [node.name for node in nodes] == ["n1"]


def test_gres_counts_past_the_cap_are_left_out() -> None:
    assert gres_counts("gpu:a100:4(S:0-1),gpu:t4:2") == {"a100": 4, "t4": 2}
    assert gres_counts("gpu:a100:200000,gpu:t4:2") == {"t4": 2}
    assert gres_counts(f"gpu:h100:{MAX_ACCELERATORS_PER_NODE}") == {
        "h100": MAX_ACCELERATORS_PER_NODE
    }
    assert gres_counts("gpu:a100:" + "9" * 5000) == {}


async def test_an_absurd_gpu_count_builds_no_birth_of_that_size() -> None:
    cluster = one_node_cluster()
    cluster.nodes.append(ClusterNode("n2", ("gpu",), 8, 64 << 30, {"a100": 200_000}, {}))
    registry = NodeRegistry(max_nodes=10)
    bridge = bridge_of(cluster, registry)
    started = time.monotonic()
    await bridge.step()
    await bridge.step()
    assert time.monotonic() - started < 2.0
    record = registry.get("lab.n2")
    assert record is not None
    assert [a.id for a in record.status.accelerators] == ["cpu0"]
    first = registry.get("lab.n1")
    assert first is not None
    assert len(first.status.accelerators) == 5


class UnreadableCluster(MemoryCluster):
    """Its job listing holds something no parser foresaw."""

    def __init__(self) -> None:
        super().__init__()
        self.unreadable = False

    async def jobs(self, *, include_ended: bool = True) -> tuple[ClusterJob, ...]:
        if self.unreadable:
            raise ValueError("invalid literal for int() with base 10: 'a'")
        return await super().jobs(include_ended=include_ended)


async def test_an_unreadable_answer_marks_the_cluster_unreachable_and_reports_go_on() -> None:
    cluster = UnreadableCluster()
    registry = NodeRegistry(max_nodes=10)
    notified: list[int] = []
    bridge = bridge_of(cluster, registry, notify=lambda: notified.append(1))
    bridge.accept(document(entry()))
    for _ in range(3):  # announced, submitted, seen running
        await bridge.step()
    assert state_of(registry) == ("running", None)
    cluster.unreadable = True
    notified.clear()
    await bridge.step()  # must not raise
    assert not bridge.health.reachable
    assert "could not be read" in bridge.health.last_error
    assert "invalid literal" in bridge.health.last_error
    record = registry.get("lab.n1")
    assert record is not None
    assert UNREACHABLE_TAINT in [taint.key for taint in record.status.taints]
    assert state_of(registry) == ("running", None)  # the last known state stands
    assert notified == [1]
    cluster.unreadable = False
    await bridge.step()
    assert bridge.health.reachable


# ---- 4: per-job bookkeeping is pruned ------------------------------------------------


@pytest.mark.parametrize("with_logs", [False, True])
async def test_per_job_bookkeeping_does_not_grow_with_every_job_ever_run(with_logs: bool) -> None:
    cluster = one_node_cluster()
    registry = NodeRegistry(max_nodes=10)
    clock = [1000.0]
    bridge = bridge_of(
        cluster,
        registry,
        clock=lambda: clock[0],
        on_log=(lambda chunk: None) if with_logs else None,
    )
    await bridge.step()
    for index in range(200):
        job_id = f"01J{index:023d}"
        bridge.accept(document(entry(job_id), generation=2 * index + 1))
        clock[0] += 5.0
        await bridge.step()
        (backend_id,) = cluster.jobs_held
        if index % 2:  # half end and are forgotten by the cluster
            cluster.jobs_held.pop(backend_id)
        else:  # half end and are still listed
            cluster.jobs_held[backend_id] = dataclasses.replace(
                cluster.jobs_held[backend_id],
                state="succeeded",
                consumed_energy_j=100.0,
                finished_at=clock[0],
                output_path=f"/shared/gf/{job_id}.out",  # read to its end (nothing)
            )
        bridge.accept(document(generation=2 * index + 2))
        clock[0] += 400.0  # past the history's interval: a forgotten job is missed
        await bridge.step()
        cluster.jobs_held.clear()  # the cluster's listing ages out too
    await bridge.step()
    bookkeeping = {
        name: len(getattr(bridge, name))
        for name in (
            "_submitted", "_vanished", "_refused", "_log_offsets", "_log_done",
            "_job_energy_j", "_energy_devices", "_ended_unseen", "_jobs",
        )
    }  # fmt: skip
    assert bookkeeping == dict.fromkeys(bookkeeping, 0)


async def test_a_job_still_named_keeps_its_bookkeeping() -> None:
    # Pruning forgets only what no document names: a vanished job the loop still
    # holds keeps being reported failed, and a live one keeps being tracked.
    cluster = one_node_cluster()
    registry = NodeRegistry(max_nodes=10)
    clock = [1000.0]
    bridge = bridge_of(cluster, registry, clock=lambda: clock[0])
    bridge.accept(document(entry(), entry(OTHER, ids=("gpu1",))))
    await bridge.step()
    await bridge.step()
    (vanishing,) = [k for k, j in cluster.jobs_held.items() if j.job_id == VICTIM]
    cluster.jobs_held.pop(vanishing)
    clock[0] += 400.0
    await bridge.step()
    await bridge.step()
    record = registry.get("lab.n1")
    assert record is not None
    assert record.reported is not None
    states = {t.job_id: t.state for t in record.reported.training}
    assert states == {VICTIM: "failed", OTHER: "running"}
    assert set(bridge._submitted) == {(VICTIM, 1), (OTHER, 1)}
