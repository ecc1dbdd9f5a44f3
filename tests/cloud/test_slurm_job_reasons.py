"""What a Slurm job's state and reason tell greenfed beyond the common cases
(cloud/clusters/slurm/records.py), read the same through `scontrol -o` and through
slurmrestd (cloud/clusters/slurm/rest_dialects.py):

- a SIGSTOPped job (STOPPED) still holds its allocation: it is running, not failed (a
  failure would use up a retry and place the next attempt while this one holds its GPUs);
- a job Slurm could not launch says so, with Slurm's reason, and has no exit code (its
  ExitCode holds a Slurm error number read as a wait status, never a code of the job's);
- an ordinary failure keeps Slurm's reason beside the exit code."""

from __future__ import annotations

from typing import Any

import pytest

from cloud.clusters.backend import ClusterJob
from cloud.clusters.slurm.records import jobs_of
from cloud.clusters.slurm.rest_dialects import V0038, dialect_of

JOB = "01M8XES6JQ9S91MCASPSBYBS71"
NEWER = ("v0.0.41", "v0.0.45")
LAUNCH_FAILED = "the cluster could not launch the job (JobLaunchFailure)"


def scontrol_job(state: str, reason: str, exit_code: str) -> ClusterJob:
    """One of greenfed's jobs as `scontrol -o show job` prints it."""
    line = (
        f"JobId=7 JobName=gf-{JOB}-1 UserId=root(0) JobState={state} Reason={reason} "
        f"ExitCode={exit_code} SubmitTime=1796284836 StartTime=1796284838 "
        f"EndTime=1796284900 NodeList=gfnode1 Comment=greenfed:{JOB}:1:acme\n"
    )
    (job,) = jobs_of(line)
    return job


def v0038_job(state: str, reason: str, wait_status: int) -> ClusterJob:
    raw = {
        "job_id": 7,
        "name": f"gf-{JOB}-1",
        "job_state": state,
        "state_reason": reason,
        "exit_code": wait_status,
        "nodes": "gfnode1",
    }
    job = V0038("v0.0.38").job(raw)
    assert job is not None
    return job


def newer_job(version: str, state: list[str], reason: str, exit_code: dict[str, Any]) -> ClusterJob:
    raw = {
        "job_id": 7,
        "name": f"gf-{JOB}-1",
        "job_state": state,
        "state_reason": reason,
        "exit_code": exit_code,
        "nodes": "gfnode1",
    }
    job = dialect_of(version).job(raw)
    assert job is not None
    return job


def test_a_sigstopped_job_still_holds_its_allocation_and_is_running() -> None:
    for job in (
        scontrol_job("STOPPED", "None", "0:0"),
        v0038_job("STOPPED", "None", 0),
        *(newer_job(v, ["STOPPED"], "None", {"status": ["PENDING"]}) for v in NEWER),
    ):
        assert (job.state, job.reason) == ("running", "stopped (SIGSTOP) on the cluster")
        assert (job.exit_code, job.finished_at) == (None, None)


def test_a_job_the_cluster_could_not_launch_says_so_without_a_made_up_exit_code() -> None:
    # Slurm 22.05 when slurmd cannot open the --output file: ExitCode=0:53.
    signal_53 = {"id": {"set": True, "infinite": False, "number": 53}, "name": ""}
    zero = {"set": True, "infinite": False, "number": 0}
    for job in (
        scontrol_job("FAILED", "JobLaunchFailure", "0:53"),
        v0038_job("FAILED", "JobLaunchFailure", 53),
        *(
            newer_job(
                v,
                ["FAILED"],
                "JobLaunchFailure",
                {"status": ["SIGNALED"], "return_code": zero, "signal": signal_53},
            )
            for v in NEWER
        ),
    ):
        assert (job.state, job.reason, job.exit_code) == ("failed", LAUNCH_FAILED, None)


@pytest.mark.parametrize(
    ("reason", "exit_code", "expected"),
    [
        # Slurm's reason only repeats what the exit code says.
        ("NonZeroExitCode", "3:0", ("exit code 3", 3)),
        ("RaisedSignal", "0:9", ("exit code 137; RaisedSignal", 137)),
        ("SystemFailure", "1:0", ("exit code 1; SystemFailure", 1)),
    ],
)
def test_a_failed_job_keeps_slurms_reason_beside_its_exit_code(
    reason: str, exit_code: str, expected: tuple[str, int]
) -> None:
    job = scontrol_job("FAILED", reason, exit_code)
    assert (job.state, job.reason, job.exit_code) == ("failed", *expected)
