"""Slurm's records read into the back-end's terms (cloud/clusters/slurm/records.py), on
lines Slurm 22.05 printed (`scontrol -o`, `sacct -P`), and the batch job a gang becomes
(cloud/clusters/slurm/script.py). The whole path runs on a real cluster in
tests/integration/test_slurm_backend.py."""

from __future__ import annotations

import pytest

from cloud.clusters.backend import GangMember, GangRequest
from cloud.clusters.slurm.records import (
    accounted_jobs,
    allocated_gpus,
    energy_of_live_jobs,
    expand_hostlist,
    gathers_energy,
    gres_counts,
    job_state,
    jobs_of,
    nodes_of,
)
from cloud.clusters.slurm.script import SubmitOptions, batch_script, sbatch_arguments

JOB = "01M8XES6JQ9S91MCASPSBYBS71"
NODES = (
    "NodeName=gfnode1 Arch=x86_64 CoresPerSocket=8  CPUAlloc=1 CPUEfctv=8 CPUTot=8 "
    "CPULoad=0.68 AvailableFeatures=(null) Gres=gpu:a100:4 NodeAddr=127.0.0.1 "
    "OS=Linux 6.18.44-fc-v1147 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 AllocMem=500 "
    "State=MIXED Partitions=gpu,debug  CfgTRES=cpu=8,mem=8000M,billing=8,gres/gpu=4 "
    "AllocTRES=cpu=1,mem=500M,gres/gpu=4 CapWatts=n/a\n"
    "NodeName=gfnode2 CPUTot=8 Gres=gpu:a100:4(S:0),gpu:t4:2 RealMemory=8000 "
    "State=IDLE+DRAIN Partitions=gpu AllocTRES= Reason=bad_fan [root@1796284826]\n"
)
RUNNING = (
    f"JobId=3 JobName=gf-{JOB}-1 UserId=root(0) JobState=RUNNING Reason=None "
    "ExitCode=0:0 SubmitTime=1796284836 StartTime=1796284838 EndTime=Unknown "
    f"NodeList=gfnode[1-2] Comment=greenfed:{JOB}:1:acme StdOut=/tmp/jobs/gf-x-3.out\n"
    "JobId=4 JobName=somebody-else JobState=RUNNING NodeList=gfnode1\n"
    f"JobId=5 JobName=gf-{JOB}-2 JobState=PENDING Reason=Resources ExitCode=0:0 "
    "SubmitTime=1796284840 StartTime=Unknown EndTime=Unknown NodeList=(null)\n"
)


def test_nodes_say_their_gpus_by_type_what_slurm_allocated_and_why_they_take_no_work() -> None:
    first, second = nodes_of(NODES)
    assert (first.name, first.partitions, first.cpus) == ("gfnode1", ("gpu", "debug"), 8)
    assert first.memory_bytes == 8000 * 2**20
    assert (first.accelerators, first.allocated, first.unavailable) == (
        {"a100": 4},
        {"a100": 4},
        "",
    )
    assert second.accelerators == {"a100": 4, "t4": 2}
    assert second.allocated == {}
    assert second.unavailable == "idle+drain: bad_fan"


def test_gres_and_allocations() -> None:
    assert gres_counts("gpu:a100:4(S:0-1),gpu:t4:2,shard:8") == {"a100": 4, "t4": 2}
    assert gres_counts("gpu:2") == {"gpu": 2}
    assert gres_counts("(null)") == {}
    assert allocated_gpus("cpu=4,gres/gpu=2,gres/gpu:a100=2", {"a100": 4}) == {"a100": 2}
    # Untyped only, several types: counted against them in order.
    assert allocated_gpus("gres/gpu=5", {"a100": 4, "t4": 2}) == {"a100": 4, "t4": 1}


def test_only_greenfeds_jobs_are_read_with_their_state_times_and_nodes() -> None:
    running, pending = jobs_of(RUNNING)
    assert (running.backend_id, running.job_id, running.attempt) == ("3", JOB, 1)
    assert (running.state, running.reason, running.exit_code) == ("running", "", None)
    assert (running.started_at, running.finished_at) == (1796284838.0, None)
    assert running.nodes == ("gfnode1", "gfnode2")
    assert running.output_path == "/tmp/jobs/gf-x-3.out"
    assert (pending.state, pending.reason, pending.nodes) == ("pending", "Resources", ())


def test_accounting_reads_ended_jobs() -> None:
    text = (
        f"7|gf-{JOB}-1|FAILED|3:0|1796284831|1796284832|1796284833|gfnode1|0|greenfed:{JOB}:1:acme\n"
        f"8|gf-{JOB}-2|CANCELLED by 0|0:15|1796284831|1796284832|1796284840|gfnode1||\n"
        f"10|gf-{JOB}-3|COMPLETED|0:0|1796284831|1796284832|1796288432|gfnode2|5400000|\n"
        "9|not-ours|COMPLETED|0:0|1|2|3|gfnode1|0|\n"
    )
    failed, cancelled, done = accounted_jobs(text)
    assert (failed.state, failed.reason, failed.exit_code) == ("failed", "exit code 3", 3)
    assert failed.finished_at == 1796284833.0
    assert (cancelled.state, cancelled.reason) == ("stopped", "cancelled on the cluster")
    # ConsumedEnergyRaw, J, where the cluster measured any (0 and empty: none).
    assert (failed.consumed_energy_j, cancelled.consumed_energy_j) == (None, None)
    assert done.consumed_energy_j == 5_400_000.0


def test_running_jobs_energy_is_read_only_where_the_cluster_gathers_it() -> None:
    assert energy_of_live_jobs("41|123456\n42|\n43|0\n44|18446744073709551614\n") == {
        "41": 123456.0
    }
    config = "AccountingStorageType   = accounting_storage/slurmdbd\n"
    assert gathers_energy(config + "AcctGatherEnergyType    = acct_gather_energy/ipmi\n")
    assert gathers_energy(config + "AcctGatherEnergyType    = acct_gather_energy/gpu\n")
    assert not gathers_energy(config + "AcctGatherEnergyType    = acct_gather_energy/none\n")
    assert not gathers_energy(config + "AcctGatherEnergyType    = (null)\n")
    assert not gathers_energy(config)


@pytest.mark.parametrize(
    ("slurm", "reason", "exit_code", "expected"),
    [
        ("PENDING", "Priority", None, ("pending", "Priority")),
        ("REQUEUED", "None", None, ("pending", "requeued by the cluster")),
        ("SUSPENDED", "None", None, ("running", "suspended by the cluster")),
        ("COMPLETED", "None", 0, ("succeeded", "")),
        ("TIMEOUT", "TimeLimit", None, ("failed", "the job reached its time limit; TimeLimit")),
        ("NODE_FAIL", "None", None, ("failed", "a node of the job failed")),
        ("PREEMPTED", "None", None, ("stopped", "preempted by the cluster's scheduler")),
        ("BOGUS", "", None, ("failed", "unknown Slurm state 'BOGUS'")),
    ],
)
def test_slurm_states_mean_greenfed_states(
    slurm: str, reason: str, exit_code: int | None, expected: tuple[str, str]
) -> None:
    assert job_state(slurm, reason, exit_code) == expected


def test_host_lists_expand() -> None:
    assert expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_hostlist("a[1-2]b") == ["a1b", "a2b"]


def test_a_gang_is_one_job_with_greenfeds_name_and_environment() -> None:
    gang = GangRequest(
        job_id=JOB,
        attempt=2,
        tenant="acme",
        partition="gpu",
        members=(GangMember("gfnode1", 4, 4, 16), GangMember("gfnode2", 4, 4, 16)),
        accelerator_type="a100",
        command=("python", "train.py", "--name", "it's"),
        env={"LR": "0.1 0.2"},
        working_dir=None,
        master_port=29500,
        per_node=False,
        time_limit_s=3601,
        priority="p0",
        grace_period_s=30,
    )
    options = SubmitOptions(work_dir="/shared/gf", qos={"p0": "high"}, nice={"p2": 100})
    arguments = sbatch_arguments(gang, options)
    assert f"--job-name=gf-{JOB}-2" in arguments
    for expected in ("--nodes=2", "--nodelist=gfnode1,gfnode2", "--ntasks-per-node=4",
                     "--gres=gpu:a100:4", "--cpus-per-task=4", "--time=61", "--qos=high",
                     "--export=NONE", "--chdir=/shared/gf", "--partition=gpu"):  # fmt: skip
        assert expected in arguments
    assert not any(argument.startswith("--nice") for argument in arguments)
    script = batch_script(gang)
    assert "export LR='0.1 0.2'" in script
    assert "python train.py --name 'it'\"'\"'s'" in script
    assert 'RANK="$SLURM_PROCID"' in script
