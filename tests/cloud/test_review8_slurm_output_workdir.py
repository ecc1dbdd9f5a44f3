"""A Slurm job's output read over SSH is the file's bytes, as it is read on this host: a
UTF-8 character cut by a read, or a byte that is not UTF-8, comes back as it is in the
file (the bridge joins a cut character with the next read, and moves its offset by the
bytes it was given). A job's relative working_dir runs under the registration's
work_dir, not wherever `sbatch` or slurmrestd happen to run.

`ssh` is faked by a script that runs the remote command line here, as sshd would; the
other Slurm commands by tests/support/slurm_commands.py."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from cloud.clusters.backend import ClusterJob, ClusterRefused, GangMember, GangRequest
from cloud.clusters.slurm.backend import SlurmBackend
from cloud.clusters.slurm.commands import SlurmAccess, SlurmCommands
from cloud.clusters.slurm.rest_dialects import V0038, dialect_of
from cloud.clusters.slurm.script import (
    SubmitOptions,
    batch_script,
    job_shape,
    sbatch_arguments,
)
from tests.support.slurm_commands import FakeSlurmBin

JOB = "01M8XES6JQ9S91MCASPSBYBSSH"
SLURM_JOB_ID = "77"
TEST_TIMEOUT_S = 20.0
# Stands in for `ssh [options] -- host command`: the command, run by `sh -c`.
_FAKE_SSH = '#!/bin/sh\nfor last; do :; done\nexec sh -c "$last"\n'


@pytest.fixture
def over_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SlurmCommands:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(_FAKE_SSH)
    ssh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return SlurmCommands(SlurmAccess(ssh="gf@login1"))


def finished_job(output_path: str) -> ClusterJob:
    return ClusterJob(
        SLURM_JOB_ID, JOB, 1, "succeeded", nodes=("gfnode1",), output_path=output_path
    )


def output_of(work_dir: Path, content: bytes) -> str:
    path = work_dir / f"gf-{JOB}-1-{SLURM_JOB_ID}.out"
    path.write_bytes(content)
    return str(path)


async def read_all(backend: SlurmBackend, job: ClusterJob, limit: int) -> list[bytes]:
    """Every read of the job's output, `limit` bytes at a time, each from where the last
    one ended (as the bridge follows it)."""
    reads: list[bytes] = []
    offset = 0
    async with asyncio.timeout(TEST_TIMEOUT_S):
        while data := await backend.read_output(job, offset, limit):
            reads.append(data)
            offset += len(data)
    return reads


# ---- output over SSH ----------------------------------------------------------------


async def test_a_character_cut_by_a_read_over_ssh_comes_back_cut_as_in_the_file(
    tmp_path: Path, over_ssh: SlurmCommands
) -> None:
    content = ("a" * 9 + "é" + "line after the boundary\nÜnïcödé end\n").encode()
    path = output_of(tmp_path, content)
    options = SubmitOptions(work_dir=str(tmp_path))
    remote = SlurmBackend(over_ssh, options)
    # 10 bytes: the 2-byte é is cut after its first byte.
    first = await remote.read_output(finished_job(path), 0, 10)
    assert first == content[:10] == b"a" * 9 + b"\xc3"
    reads = await read_all(remote, finished_job(path), 10)
    assert b"".join(reads) == content
    # The same reads as where the file is on this host.
    local = SlurmBackend(SlurmCommands(SlurmAccess()), options)
    assert reads == await read_all(local, finished_job(path), 10)


async def test_bytes_that_are_not_utf8_come_back_over_ssh_as_they_are(
    tmp_path: Path, over_ssh: SlurmCommands
) -> None:
    content = b"step 1\n\xff\xfe binary \x80 junk\nstep 2\n"
    path = output_of(tmp_path, content)
    remote = SlurmBackend(over_ssh, SubmitOptions(work_dir=str(tmp_path)))
    assert b"".join(await read_all(remote, finished_job(path), 8)) == content
    assert await remote.read_output(finished_job(path), len(content), 8) == b""


async def test_commands_text_is_still_text(over_ssh: SlurmCommands) -> None:
    async with asyncio.timeout(TEST_TIMEOUT_S):
        assert await over_ssh.run("printf", "caf\\303\\251 \\377") == "café \ufffd"
        assert await over_ssh.run_bytes("printf", "caf\\303\\251 \\377") == b"caf\xc3\xa9 \xff"


# ---- a relative working_dir ---------------------------------------------------------


def gang(working_dir: str | None) -> GangRequest:
    return GangRequest(
        job_id=JOB,
        attempt=1,
        tenant="acme",
        partition="gpu",
        members=(GangMember("gfnode1", 1, 0, 1),),
        accelerator_type=None,
        command=("pwd",),
        env={},
        working_dir=working_dir,
        master_port=29500,
        per_node=False,
        time_limit_s=None,
        priority="p1",
        grace_period_s=30.0,
    )


def chdir_of(arguments: list[str]) -> list[str]:
    return [argument for argument in arguments if argument.startswith("--chdir")]


@pytest.mark.parametrize(
    ("working_dir", "expected"),
    [
        ("data", "/shared/gf/data"),
        ("runs/7/", "/shared/gf/runs/7/"),
        ("./data", "/shared/gf/./data"),
        ("/scratch/acme", "/scratch/acme"),
        (None, "/shared/gf"),
    ],
)
def test_a_relative_working_dir_is_under_the_registrations_work_dir(
    working_dir: str | None, expected: str
) -> None:
    options = SubmitOptions(work_dir="/shared/gf")
    assert chdir_of(sbatch_arguments(gang(working_dir), options)) == [f"--chdir={expected}"]
    # slurmrestd is asked for the same directory.
    shape, script = job_shape(gang(working_dir), options), batch_script(gang(working_dir))
    for dialect in (V0038("v0.0.38"), dialect_of("v0.0.41")):
        assert dialect.submit_body(shape, script)["job"]["current_working_directory"] == expected


def test_a_work_dir_with_a_trailing_slash_gives_one_slash() -> None:
    options = SubmitOptions(work_dir="/shared/gf/")
    assert chdir_of(sbatch_arguments(gang("data"), options)) == ["--chdir=/shared/gf/data"]


@pytest.mark.parametrize("work_dir", ["", "jobs"])
def test_a_relative_working_dir_without_an_absolute_work_dir_is_refused(work_dir: str) -> None:
    with pytest.raises(ClusterRefused, match="relative working_dir 'data'"):
        sbatch_arguments(gang("data"), SubmitOptions(work_dir=work_dir))
    # An absolute one needs no work_dir.
    assert chdir_of(sbatch_arguments(gang("/srv"), SubmitOptions(work_dir=work_dir))) == [
        "--chdir=/srv"
    ]


async def test_sbatch_is_run_with_the_joined_directory(tmp_path: Path) -> None:
    fake = FakeSlurmBin(tmp_path / "slurm")
    fake.answer("sbatch", "4242\n")
    commands = SlurmCommands(SlurmAccess(bin_dir=str(fake.path)))
    backend = SlurmBackend(commands, SubmitOptions(work_dir="/shared/gf"))
    async with asyncio.timeout(TEST_TIMEOUT_S):
        assert await backend.submit(gang("data")) == "4242"
    (call,) = fake.calls("sbatch")
    assert "--chdir=/shared/gf/data" in call.split()
