"""What greenfed believes of a Slurm cluster's answers (cloud/clusters/slurm/): records
a tenant's own values cannot forge, jobs that are greenfed's by more than their name,
job ids that are numbers, output read only from the file greenfed asked for, and a
command line no command can take refused rather than stopping the bridge. The Slurm
commands are faked; tests/integration/test_slurm_backend.py runs a real cluster."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cloud.clusters.backend import ClusterJob, ClusterRefused, GangMember, GangRequest
from cloud.clusters.slurm.backend import SlurmBackend
from cloud.clusters.slurm.commands import SlurmAccess, SlurmCommands
from cloud.clusters.slurm.records import accounted_jobs, jobs_of, key_values, nodes_of
from cloud.clusters.slurm.rest_backend import SlurmRestBackend
from cloud.clusters.slurm.rest_client import SlurmRestAccess, SlurmRestClient
from cloud.clusters.slurm.rest_dialects import V0038
from cloud.clusters.slurm.script import SubmitOptions
from cloud.work.specs import decode_spec

OWN = "01HZZZZZZZZZZZZZZZZZZZZZZA"  # the tenant who tries
VICTIM = "01HVVVVVVVVVVVVVVVVVVVVVVV"  # another tenant


def job_line(job_id: str, name: str, state: str, work_dir: str, **extra: str) -> str:
    """One `scontrol -o show job` record, its fields in Slurm's order."""
    job, attempt = name.removeprefix("gf-").rsplit("-", 1)
    fields = {
        "Comment": f"greenfed:{job}:{attempt}:acme",
        "StdOut": f"/shared/gf/{name}-{job_id}.out",
        **extra,
    }
    return (
        f"JobId={job_id} JobName={name} UserId=greenfed(1001) JobState={state} Reason=None "
        f"ExitCode=0:0 SubmitTime=1699990000 StartTime=1699990001 EndTime=1700090001 "
        f"NodeList=n1 Command=(null) WorkDir={work_dir} Comment={fields['Comment']} "
        f"StdErr={fields['StdOut']} StdIn=/dev/null StdOut={fields['StdOut']}"
    )


def gang(**changes: Any) -> GangRequest:
    fields: dict[str, Any] = {
        "job_id": OWN,
        "attempt": 1,
        "tenant": "acme",
        "partition": "gpu",
        "members": (GangMember("n1", 1, 1, 0),),
        "accelerator_type": None,
        "command": ("train",),
        "env": {},
        "working_dir": None,
        "master_port": 29500,
        "per_node": False,
        "time_limit_s": None,
        "priority": "p1",
        "grace_period_s": 30.0,
    }
    return GangRequest(**{**fields, **changes})


class FakeCommands(SlurmCommands):
    """Slurm's commands answering from `answers` (by program); each call is kept."""

    def __init__(self, answers: dict[str, str], access: SlurmAccess | None = None) -> None:
        super().__init__(access or SlurmAccess())
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []

    async def run(self, *argv: str, stdin: bytes | None = None) -> str:
        self.calls.append(argv)
        return self.answers.get(argv[0], "")

    async def run_bytes(self, *argv: str, stdin: bytes | None = None) -> bytes:
        return (await self.run(*argv, stdin=stdin)).encode()


# ---- 1: a working_dir cannot forge records -------------------------------------------


@pytest.mark.parametrize(
    "working_dir",
    [
        "/scratch/x JobState=COMPLETED",
        "/scratch/x\tJobState=COMPLETED",
        "/tmp/a\x00b",
        "/tmp/a\nb",
        "/tmp/a\u2028b",
        "/tmp/a\x0cb",
        "/tmp/a\x85b",
        "/tmp/a\x1bb",
    ],
)
def test_a_working_dir_with_whitespace_or_control_characters_is_refused(working_dir: str) -> None:
    document = {"name": "x", "command": ["true"], "working_dir": working_dir}
    with pytest.raises(msgspec.ValidationError, match="working_dir"):
        decode_spec("training", json.dumps(document).encode())


def test_a_plain_working_dir_is_taken() -> None:
    document = {"name": "x", "command": ["true"], "working_dir": "/srv/jobs/run-1_a.b"}
    spec = decode_spec("training", json.dumps(document).encode())
    assert getattr(spec, "working_dir", None) == "/srv/jobs/run-1_a.b"


def test_pairs_inside_a_value_do_not_change_a_jobs_state() -> None:
    # A working_dir accepted before it was checked, printed back raw by scontrol.
    forged = job_line("500", f"gf-{OWN}-1", "RUNNING", "/x JobState=COMPLETED ExitCode=0:0")
    honest = job_line("501", f"gf-{OWN}-2", "RUNNING", "/x")
    assert key_values(forged) is None  # a key twice: the line is not believed
    assert [(job.backend_id, job.state) for job in jobs_of(forged + "\n" + honest)] == [
        ("501", "running")
    ]


def test_pairs_inside_a_value_do_not_make_another_tenants_job() -> None:
    forged = f"/y JobId=99999 JobName=gf-{VICTIM}-1 JobState=FAILED"
    listing = job_line("400", f"gf-{VICTIM}-1", "RUNNING", "/home/v") + "\n"
    listing += job_line("501", f"gf-{OWN}-2", "RUNNING", forged)
    assert [(job.backend_id, job.job_id, job.state) for job in jobs_of(listing)] == [
        ("400", VICTIM, "running")
    ]


def test_later_pairs_do_not_replace_the_output_file_or_comment() -> None:
    # Comment and StdOut come after WorkDir: keeping the first of a key would believe
    # the tenant's; the whole record is left out instead.
    forged = "/x Comment=greenfed:x StdOut=/etc/shadow"
    assert jobs_of(job_line("502", f"gf-{OWN}-1", "RUNNING", forged)) == ()


@pytest.mark.parametrize("separator", ["\u2028", "\x0c", "\x85", "\x1c", "\r", "\x0b"])
def test_only_a_newline_separates_records(separator: str) -> None:
    inside = f"/z{separator}JobId=77777 JobName=gf-{VICTIM}-1 JobState=CANCELLED"
    found = jobs_of(job_line("503", f"gf-{OWN}-3", "RUNNING", inside))
    assert all(job.job_id != VICTIM for job in found)
    assert all(job.backend_id != "77777" for job in found)
    nodes = nodes_of(f"NodeName=n1 CPUTot=8 Reason=a{separator}NodeName=fake CPUTot=64\n")
    assert "fake" not in [node.name for node in nodes]
    row = f"7|gf-{OWN}-1|RUNNING|0:0|1|2|0|n1|0|greenfed:{OWN}:1:acme"
    forged = f"8|gf-{VICTIM}-1|FAILED|3:0|1|2|3|n1|0|greenfed:{VICTIM}:1:v"
    assert [job.backend_id for job in accounted_jobs(row + separator + forged + "\n")] == []


# ---- 2: job ids are numbers ----------------------------------------------------------


@pytest.mark.parametrize("job_id", ["--user=greenfed", "-1", "12_3", "12+0", "²", ""])
def test_a_record_whose_job_id_is_not_a_number_is_not_greenfeds(job_id: str) -> None:
    line = job_line("1", f"gf-{OWN}-1", "RUNNING", "/x").replace("JobId=1 ", f"JobId={job_id} ")
    assert jobs_of(line) == ()
    row = f"{job_id}|gf-{OWN}-1|COMPLETED|0:0|1|2|3|n1|0|"
    assert accounted_jobs(row) == ()


async def test_scancel_gets_the_id_after_an_end_of_options() -> None:
    commands = FakeCommands({})
    backend = SlurmBackend(commands, SubmitOptions(work_dir="/shared/gf"))
    await backend.cancel(ClusterJob(backend_id="600", job_id=OWN, attempt=1, state="running"))
    assert commands.calls == [("scancel", "--", "600")]


async def test_a_job_id_that_is_not_a_number_is_never_cancelled() -> None:
    commands = FakeCommands({})
    backend = SlurmBackend(commands, SubmitOptions(work_dir="/shared/gf"))
    job = ClusterJob(backend_id="--user=greenfed", job_id=OWN, attempt=1, state="running")
    with pytest.raises(ClusterRefused):
        await backend.cancel(job)
    assert commands.calls == []


async def test_an_sbatch_answer_that_is_not_a_number_is_refused() -> None:
    commands = FakeCommands({"sbatch": "²;lab\n"})
    backend = SlurmBackend(commands, SubmitOptions(work_dir="/shared/gf"))
    with pytest.raises(ClusterRefused):
        await backend.submit(gang())


@pytest.mark.parametrize("job_id", ["7", "--x", 7.0, True, -7, None])
def test_slurmrestd_job_ids_must_be_integers(job_id: Any) -> None:
    raw = {"job_id": job_id, "name": f"gf-{OWN}-1", "job_state": "RUNNING", "comment": ""}
    assert V0038("v0.0.38").job(raw) is None
    assert V0038("v0.0.38").accounted_job(raw) is None
    assert V0038("v0.0.38").job({**raw, "job_id": 7}) is not None


async def test_slurmrestd_never_cancels_a_job_id_that_is_not_a_number() -> None:
    client = SlurmRestClient(SlurmRestAccess(url="http://127.0.0.1:1"))
    backend = SlurmRestBackend(client, SubmitOptions(work_dir="/shared/gf"), version="v0.0.38")
    try:
        job = ClusterJob(backend_id="1/../../x", job_id=OWN, attempt=1, state="running")
        with pytest.raises(ClusterRefused):
            await backend.cancel(job)
    finally:
        await backend.close()


# ---- 3: greenfed's jobs are more than their name -------------------------------------


def test_a_job_named_as_greenfeds_with_another_comment_is_not_greenfeds() -> None:
    eve = job_line("4242", f"gf-{VICTIM}-1", "RUNNING", "/home/eve", Comment="hi")
    other_attempt = job_line("4243", f"gf-{VICTIM}-1", "RUNNING", "/x")
    other_attempt = other_attempt.replace(f"greenfed:{VICTIM}:1:", f"greenfed:{VICTIM}:2:")
    ours = job_line("4244", f"gf-{VICTIM}-1", "RUNNING", "/x")
    assert [job.backend_id for job in jobs_of(f"{eve}\n{other_attempt}\n{ours}\n")] == ["4244"]
    rows = (
        f"7|gf-{VICTIM}-1|RUNNING|0:0|1|2|0|n1|0|hi\n"
        f"8|gf-{VICTIM}-1|RUNNING|0:0|1|2|0|n1|0|greenfed:{VICTIM}:1:acme\n"
        f"9|gf-{VICTIM}-1|RUNNING|0:0|1|2|0|n1|0|\n"  # a cluster that keeps no comments
    )
    assert [job.backend_id for job in accounted_jobs(rows)] == ["8", "9"]


def test_slurmrestd_jobs_with_another_comment_are_not_greenfeds() -> None:
    dialect = V0038("v0.0.38")
    raw = {"job_id": 7, "name": f"gf-{OWN}-1", "job_state": "RUNNING"}
    assert dialect.job({**raw, "comment": "hi"}) is None
    assert dialect.job({**raw, "comment": f"greenfed:{OWN}:1:acme"}) is not None
    accounted = {**raw, "state": {"current": "COMPLETED"}}
    assert dialect.accounted_job({**accounted, "comment": {"job": "hi"}}) is None
    assert dialect.accounted_job({**accounted, "comment": {"job": None}}) is not None


async def test_only_the_accounts_own_job_with_greenfeds_comment_is_adopted() -> None:
    comment = f"greenfed:{OWN}:1:acme"
    commands = FakeCommands({"squeue": f"4242|hi\n4243|(null)\n4244|{comment}\n"})
    backend = SlurmBackend(commands, SubmitOptions(work_dir="/shared/gf"))
    assert await backend.submit(gang()) == "4244"
    assert commands.calls == [("squeue", "-h", "--me", "--name", f"gf-{OWN}-1", "-o", "%i|%k")]


async def test_a_foreign_job_of_that_name_is_not_adopted() -> None:
    commands = FakeCommands({"squeue": "4242|hi\n", "sbatch": "77;lab\n"})
    backend = SlurmBackend(commands, SubmitOptions(work_dir="/shared/gf"))
    assert await backend.submit(gang()) == "77"
    assert commands.calls[-1][0] == "sbatch"


# ---- 4: output only from the file greenfed asked for, never through a link -----------


def running(backend_id: str, output: str | None) -> ClusterJob:
    return ClusterJob(
        backend_id=backend_id,
        job_id=OWN,
        attempt=1,
        state="running",
        nodes=("n1",),
        output_path=output,
    )


async def test_output_elsewhere_than_greenfed_asked_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "controlplane_secret.key"
    secret.write_text("SECRET\n")
    backend = SlurmBackend(FakeCommands({}), SubmitOptions(work_dir=str(tmp_path / "gf")))
    assert await backend.read_output(running("4242", str(secret)), 0, 1 << 16) == b""
    # Named as greenfed's file, but of another job id.
    (tmp_path / "gf").mkdir()
    other = tmp_path / "gf" / f"gf-{OWN}-1-9999.out"
    other.write_text("other\n")
    assert await backend.read_output(running("4242", str(other)), 0, 1 << 16) == b""


async def test_greenfeds_own_output_file_is_read(tmp_path: Path) -> None:
    backend = SlurmBackend(FakeCommands({}), SubmitOptions(work_dir=f"{tmp_path}/"))
    output = tmp_path / f"gf-{OWN}-1-77.out"
    output.write_text("epoch 1\nepoch 2\n")
    assert await backend.read_output(running("77", str(output)), 8, 5) == b"epoch"


async def test_a_link_in_place_of_the_output_file_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "controlplane_secret.key"
    secret.write_text("SECRET\n")
    output = tmp_path / f"gf-{OWN}-1-77.out"
    output.symlink_to(secret)
    backend = SlurmBackend(FakeCommands({}), SubmitOptions(work_dir=str(tmp_path)))
    assert await backend.read_output(running("77", str(output)), 0, 1 << 16) == b""
    rest = SlurmRestBackend(
        SlurmRestClient(SlurmRestAccess(url="http://127.0.0.1:1")),
        SubmitOptions(work_dir=str(tmp_path)),
        version="v0.0.38",
    )
    try:
        assert await rest.read_output(running("77", str(output)), 0, 1 << 16) == b""
        assert await rest.read_output(running("77", str(secret)), 0, 1 << 16) == b""
    finally:
        await rest.close()


@pytest.mark.timeout(10)  # an open that waits for a writer would hang here
async def test_a_fifo_in_place_of_the_output_file_does_not_block(tmp_path: Path) -> None:
    output = tmp_path / f"gf-{OWN}-1-77.out"
    os.mkfifo(output)
    backend = SlurmBackend(FakeCommands({}), SubmitOptions(work_dir=str(tmp_path)))
    assert await backend.read_output(running("77", str(output)), 0, 1 << 16) == b""


async def test_over_ssh_a_link_is_refused_before_tail(tmp_path: Path) -> None:
    commands = FakeCommands({}, SlurmAccess(ssh="gf@login1"))
    backend = SlurmBackend(commands, SubmitOptions(work_dir="/shared/gf"))
    await backend.read_output(running("77", f"/shared/gf/gf-{OWN}-1-77.out"), 0, 10)
    ((program, flag, script, *arguments),) = commands.calls
    assert (program, flag) == ("sh", "-c")
    assert arguments == ["sh", "0", f"/shared/gf/gf-{OWN}-1-77.out", "10"]
    # The script itself, run here on a link and on the file.
    secret = tmp_path / "secret"
    secret.write_text("SECRET\n")
    link = tmp_path / "out"
    link.symlink_to(secret)
    here = SlurmCommands(SlurmAccess())
    assert await here.run("sh", "-c", script, "sh", "0", str(link), "100") == ""
    assert await here.run("sh", "-c", script, "sh", "1", str(secret), "3") == "ECR"
    dashed = tmp_path / "-n"
    dashed.write_text("dash\n")
    assert await here.run("sh", "-c", script, "sh", "0", str(dashed), "100") == "dash\n"
    # A path reported elsewhere is not even asked for.
    await backend.read_output(running("77", "/etc/shadow"), 0, 10)
    assert len(commands.calls) == 1


async def test_over_ssh_a_link_swapped_in_after_the_check_is_not_followed(
    tmp_path: Path,
) -> None:
    # The output path flips between the job's file and a link to a file the account
    # can read, as fast as it can: the check alone (then `tail`) read the link's target
    # in about one read in twenty.
    commands = FakeCommands({}, SlurmAccess(ssh="gf@login1"))
    backend = SlurmBackend(commands, SubmitOptions(work_dir="/shared/gf"))
    await backend.read_output(running("77", f"/shared/gf/gf-{OWN}-1-77.out"), 0, 10)
    ((_, _, script, *_),) = commands.calls
    secret = tmp_path / "secret"
    secret.write_text("SECRET\n")
    plain = tmp_path / "plain"
    plain.write_text("the job's output\n")
    output = tmp_path / "out"
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            (tmp_path / "link").symlink_to(secret)
            os.replace(tmp_path / "link", output)
            os.link(plain, tmp_path / "copy")
            os.replace(tmp_path / "copy", output)

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        read = await asyncio.to_thread(
            lambda: [
                subprocess.run(
                    ["sh", "-c", script, "sh", "0", str(output), "100"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                for _ in range(300)
            ]
        )
    finally:
        stop.set()
        flipper.join()
    assert not [text for text in read if "SECRET" in text]
    assert set(read) <= {"", "the job's output\n"}


# ---- 5: an argument no command line can hold -----------------------------------------


async def test_a_nul_byte_in_an_argument_is_a_refusal() -> None:
    commands = SlurmCommands(SlurmAccess(bin_dir="/bin"))
    with pytest.raises(ClusterRefused, match="null"):
        await commands.run("echo", "a\x00b")
    over_ssh = SlurmCommands(SlurmAccess(ssh="gf@login1"))
    with pytest.raises(ClusterRefused):
        await over_ssh.run("scancel", "a\x00b")


async def test_submitting_with_a_nul_byte_is_refused_not_raised() -> None:
    class SqueueAnswersNothing(SlurmCommands):
        async def run(self, *argv: str, stdin: bytes | None = None) -> str:
            if argv[0] == "squeue":
                return ""
            return await super().run(*argv, stdin=stdin)

    backend = SlurmBackend(
        SqueueAnswersNothing(SlurmAccess(bin_dir="/bin")), SubmitOptions(work_dir="/tmp")
    )
    with pytest.raises(ClusterRefused):
        await backend.submit(gang(working_dir="/tmp/a\x00b"))
