"""A private Slurm cluster on this host for tests: munged, slurmdbd (on the local MariaDB),
slurmctld, two slurmd and slurmrestd, all in a temporary directory, on free ports.

Debian 12's Slurm 22.05 runs two slurmd on one host (`slurmd -N name`, each node with a
`Port=` of its own), so a two-node gang can be tested. Each node declares four fake A100s:
gres.conf's `File=` must name character devices (regular files are rejected), so the
cluster makes them with mknod under its own directory; with TaskPlugin=task/none nothing
ever opens them. Everything runs as root (SlurmUser=root), slurmrestd included, which
needs SLURMRESTD_SECURITY=disable_user_check to agree to that.

The daemons are plain `subprocess.Popen` children, not asyncio ones, so one cluster can
outlive the per-test event loops (the session fixture below). Starting and stopping block;
the async API runs them in a thread.

Use, from a test:

    async def test_x(slurm: SlurmCluster) -> None:
        result = await slurm.run("sbatch", "--parsable", "--wrap", "true")

or, for a cluster of one's own: `async with slurm_cluster() as cluster: ...`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.brokers import free_port, require_or_skip
from tests.support.system_tools import find_tool

# Binaries the cluster runs, and the Debian package of each (for the skip/fail message).
SLURM_TOOLS = {
    "munged": "munge",
    "mungekey": "munge",
    "munge": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "slurmdbd": "slurmdbd",
    "slurmrestd": "slurmrestd",
    "sbatch": "slurm-client",
    "squeue": "slurm-client",
    "sacct": "slurm-client",
    "sacctmgr": "slurm-client",
    "scontrol": "slurm-client",
    "sinfo": "slurm-client",
    "scancel": "slurm-client",
    "mysql": "mariadb-client",
}

MARIADB_HOST = os.environ.get("GREENFED_TEST_MARIADB_HOST", "127.0.0.1")
MARIADB_PORT = int(os.environ.get("GREENFED_TEST_MARIADB_PORT", "3306"))

NODE_NAMES = ("gfnode1", "gfnode2")
PARTITION_NAMES = ("gpu", "debug")  # gpu: both nodes, the default; debug: the first node
GRES_TYPE = "a100"
GPUS_PER_NODE = 4
# Declared, not detected (SlurmdParameters=config_overrides): a GPU node with 8 cores and
# 8 GB, so four one-GPU jobs fit on a node even on a 2-core test machine. Nothing checks
# that the cores exist; task/none binds nothing.
CPUS_PER_NODE = 8
REAL_MEMORY_MB = 8000
DEFAULT_MEMORY_PER_CPU_MB = 500

REST_API_VERSION = "v0.0.38"

STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
COMMAND_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.1
LOG_TAIL_LINES = 25


class SlurmStartupError(RuntimeError):
    """A daemon did not come up in time; the message carries the tails of all the logs."""


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, Any]:
        decoded = json.loads(self.stdout)
        assert isinstance(decoded, dict), f"{self.argv}: not a JSON object"
        return decoded


class SlurmCommandError(AssertionError):
    def __init__(self, result: CommandResult) -> None:
        super().__init__(
            f"{' '.join(result.argv)} exited {result.returncode}\n"
            f"stdout: {result.stdout.strip()}\nstderr: {result.stderr.strip()}"
        )
        self.result = result


@dataclass
class _Daemon:
    name: str
    argv: list[str]
    log_path: Path | None  # the daemon's own log file (LogFile), where it has one
    output_path: Path  # its stdout and stderr, where early fatal errors land
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.output_path.open("ab") as output:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=self.env,
                # Its own session: a Ctrl-C at the terminal reaches pytest, which then
                # stops the cluster in order, rather than every daemon at once.
                start_new_session=True,
            )

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def exited(self) -> bool:
        """Started and gone by itself (stop() forgets the process)."""
        return self.process is not None and self.process.poll() is not None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        self.process = None

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        parts = []
        for path in (self.output_path, self.log_path):
            if path is not None and path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(parts) or "(no output)"


@dataclass
class SlurmCluster:
    """A running cluster. Point Slurm commands at it with `env` (or `run`)."""

    base_dir: Path
    cluster_name: str
    database_name: str
    conf_path: Path
    env: dict[str, str]
    restd_socket: Path
    job_dir: Path  # world-writable; for batch scripts and their output files
    node_names: tuple[str, ...] = NODE_NAMES
    partition_names: tuple[str, ...] = PARTITION_NAMES
    default_partition: str = PARTITION_NAMES[0]
    gres_type: str = GRES_TYPE
    gpus_per_node: int = GPUS_PER_NODE
    cpus_per_node: int = CPUS_PER_NODE
    ports: dict[str, int] = field(default_factory=dict)
    _daemons: dict[str, _Daemon] = field(default_factory=dict, repr=False)

    # ---- commands -------------------------------------------------------------------

    async def run(
        self, *argv: str, check: bool = True, timeout_s: float = COMMAND_TIMEOUT_S
    ) -> CommandResult:
        """Run a Slurm command (sbatch, squeue, ...) against this cluster.

        Commands run in the cluster's job directory: a plain `sbatch` writes its
        `slurm-<id>.out` into its working directory, which must not be the checkout.
        """
        process = await asyncio.create_subprocess_exec(
            *argv,
            env=self.env,
            cwd=self.job_dir,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
        assert process.returncode is not None
        result = CommandResult(tuple(argv), process.returncode, stdout.decode(), stderr.decode())
        if check and result.returncode != 0:
            raise SlurmCommandError(result)
        return result

    async def run_json(self, *argv: str) -> dict[str, Any]:
        """Run a command that takes `--json` (squeue, sacct, sinfo in 22.05; not scontrol)."""
        return (await self.run(*argv, "--json")).json()

    def run_blocking(
        self, *argv: str, check: bool = True, timeout_s: float = COMMAND_TIMEOUT_S
    ) -> CommandResult:
        completed = subprocess.run(
            argv,
            env=self.env,
            cwd=self.job_dir,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
        result = CommandResult(
            tuple(argv),
            completed.returncode,
            completed.stdout.decode(errors="replace"),
            completed.stderr.decode(errors="replace"),
        )
        if check and result.returncode != 0:
            raise SlurmCommandError(result)
        return result

    # ---- slurmrestd -----------------------------------------------------------------

    def rest_session(self) -> aiohttp.ClientSession:
        """A client for slurmrestd's UNIX socket; URLs are `http://localhost/slurm/...`."""
        return aiohttp.ClientSession(
            base_url="http://localhost",
            connector=aiohttp.UnixConnector(path=str(self.restd_socket)),
        )

    # ---- slurmctld down and up (greenfed must survive it) ---------------------------

    async def stop_slurmctld(self) -> None:
        await asyncio.to_thread(self._daemons["slurmctld"].stop)

    async def start_slurmctld(self) -> None:
        await asyncio.to_thread(self.start_slurmctld_blocking)

    async def restart_slurmctld(self) -> None:
        await self.stop_slurmctld()
        await self.start_slurmctld()

    @property
    def slurmctld_running(self) -> bool:
        return self._daemons["slurmctld"].running

    def start_slurmctld_blocking(self) -> None:
        daemon = self._daemons["slurmctld"]
        if daemon.running:
            return
        daemon.start()
        self._wait(self._slurmctld_answers, "slurmctld answers `scontrol ping`")
        # After a restart the nodes are "not responding" until their slurmd registers again.
        self._wait(self._nodes_responding, "all nodes respond to slurmctld")

    # ---- state between tests --------------------------------------------------------

    async def cancel_all_jobs(self) -> None:
        await asyncio.to_thread(self.cancel_all_jobs_blocking)

    def cancel_all_jobs_blocking(self) -> None:
        """Cancel every job, and wait until none holds a node (so GPUs are free again)."""
        job_ids = self._active_job_ids()
        if job_ids:
            # --full signals the batch shell's children too, so nothing lingers.
            self.run_blocking("scancel", "--full", *job_ids, check=False)
        self._wait(lambda: not self._active_job_ids(), "every job has left the queue's nodes")

    def log_tails(self) -> str:
        return "\n".join(
            f"===== {name} =====\n{daemon.tail()}" for name, daemon in self._daemons.items()
        )

    # ---- readiness facts -------------------------------------------------------------

    def _wait(
        self, condition: Callable[[], bool], what: str, timeout_s: float = STARTUP_TIMEOUT_S
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            # A daemon stopped on purpose (stop_slurmctld) has no process; one that exited
            # by itself still has its Popen, and waiting on would only hide why.
            exited = [name for name, daemon in self._daemons.items() if daemon.exited]
            if exited:
                raise SlurmStartupError(
                    f"waiting for: {what}; exited: {', '.join(exited)}\n{self.log_tails()}"
                )
            if time.monotonic() > deadline:
                raise SlurmStartupError(
                    f"timed out after {timeout_s} s waiting for: {what}\n{self.log_tails()}"
                )
            time.sleep(POLL_INTERVAL_S)

    def _slurmctld_answers(self) -> bool:
        result = self.run_blocking("scontrol", "ping", check=False, timeout_s=10)
        return "is UP" in result.stdout

    def _node_states(self) -> dict[str, str]:
        result = self.run_blocking("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        if result.returncode != 0:
            return {}
        return dict(line.split() for line in result.stdout.splitlines() if line.strip())

    def _nodes_responding(self) -> bool:
        # "*" marks a node that does not respond; "idle", "mixed", "allocated" are usable.
        states = self._node_states()
        return set(states) == set(self.node_names) and all(
            state in {"idle", "mixed", "allocated"} for state in states.values()
        )

    def _nodes_idle(self) -> bool:
        states = self._node_states()
        return set(states) == set(self.node_names) and set(states.values()) == {"idle"}

    def _active_job_ids(self) -> list[str]:
        result = self.run_blocking("squeue", "-h", "-o", "%i", check=False)
        return result.stdout.split() if result.returncode == 0 else []

    def _restd_answers(self) -> bool:
        if not self.restd_socket.exists():
            return False
        return _unix_http_status(self.restd_socket, f"/slurm/{REST_API_VERSION}/ping") == 200


def _unix_http_status(socket_path: Path, path: str) -> int:
    """The status of a GET over a UNIX socket, or 0; small enough not to need aiohttp."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(str(socket_path))
            client.sendall(
                f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
            )
            status_line = client.recv(64).split(b"\r\n", 1)[0].split()
            return int(status_line[1]) if len(status_line) > 1 else 0
    except (OSError, ValueError):
        return 0


# ---- configuration -------------------------------------------------------------------


def _node_lines(ports: dict[str, int]) -> str:
    return "\n".join(
        f"NodeName={name} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 "
        f"Port={ports[name]} CPUs={CPUS_PER_NODE} Sockets=1 CoresPerSocket={CPUS_PER_NODE} "
        f"ThreadsPerCore=1 RealMemory={REAL_MEMORY_MB} "
        f"Gres=gpu:{GRES_TYPE}:{GPUS_PER_NODE} State=UNKNOWN"
        for name in NODE_NAMES
    )


def _slurm_conf(base: Path, cluster_name: str, ports: dict[str, int]) -> str:
    munge_socket = base / "munge" / "munge.socket"
    return f"""\
ClusterName={cluster_name}
SlurmctldHost={socket.gethostname()}(127.0.0.1)
SlurmctldPort={ports["slurmctld"]}
SlurmdPort={ports[NODE_NAMES[0]]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={base / "state"}
SlurmdSpoolDir={base / "spool"}/%n
SlurmctldPidFile={base / "run" / "slurmctld.pid"}
SlurmdPidFile={base / "run"}/slurmd-%n.pid
SlurmctldLogFile={base / "log" / "slurmctld.log"}
SlurmdLogFile={base / "log"}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: the test machine's cgroup v1 hierarchy is not Slurm's to take over.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU={DEFAULT_MEMORY_PER_CPU_MB}
SlurmdParameters=config_overrides
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={ports["slurmdbd"]}
# The munge socket slurmctld and the commands use for slurmdbd (else the system one).
AccountingStoragePass={munge_socket}
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
# Clients retry an unreachable slurmctld for about MessageTimeout seconds; kept short so
# a test with slurmctld down is not slow.
MessageTimeout=5
SlurmctldTimeout=30
SlurmdTimeout=30
MinJobAge=300
KillWait=2
{_node_lines(ports)}
PartitionName=gpu Nodes={",".join(NODE_NAMES)} Default=YES MaxTime=INFINITE State=UP
PartitionName=debug Nodes={NODE_NAMES[0]} Default=NO MaxTime=INFINITE State=UP
"""


def _gres_conf(devices: Path) -> str:
    lines = []
    for index, name in enumerate(NODE_NAMES):
        first = index * GPUS_PER_NODE
        files = f"{devices}/nvidia[{first}-{first + GPUS_PER_NODE - 1}]"
        lines.append(f"NodeName={name} Name=gpu Type={GRES_TYPE} File={files}")
    return "\n".join(lines) + "\n"


def _slurmdbd_conf(base: Path, database_name: str, port: int) -> str:
    return f"""\
AuthType=auth/munge
AuthInfo=socket={base / "munge" / "munge.socket"}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={port}
SlurmUser=root
LogFile={base / "log" / "slurmdbd.log"}
PidFile={base / "run" / "slurmdbd.pid"}
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost={MARIADB_HOST}
StoragePort={MARIADB_PORT}
StorageUser=root
StorageLoc={database_name}
"""


def _make_fake_gpus(devices: Path) -> None:
    """Character devices with NVIDIA's major number: slurmd 22.05 rejects regular files
    ("is not a valid character or block device")."""
    devices.mkdir()
    for minor in range(GPUS_PER_NODE * len(NODE_NAMES)):
        os.mknod(devices / f"nvidia{minor}", 0o600 | 0o020000, os.makedev(195, minor))


def _slurm_env(conf_path: Path) -> dict[str, str]:
    # Inherited SLURM_* variables (a test run inside a Slurm job) would point the commands
    # at another cluster or job.
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM")}
    env["SLURM_CONF"] = str(conf_path)
    return env


def _mysql(statement: str) -> None:
    subprocess.run(
        ["mysql", "-h", MARIADB_HOST, "-P", str(MARIADB_PORT), "-u", "root", "-e", statement],
        check=True,
        capture_output=True,
        timeout=COMMAND_TIMEOUT_S,
    )


def _tcp_reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


# ---- lifecycle ----------------------------------------------------------------------


def require_slurm() -> None:
    """Skip (or, under GREENFED_TEST_REQUIRE_SERVICES=1, fail) where the cluster cannot run."""
    missing = sorted({package for tool, package in SLURM_TOOLS.items() if not find_tool(tool)})
    if missing:
        require_or_skip(f"Slurm is not installed (Debian packages: {' '.join(missing)})")
    if os.geteuid() != 0:
        require_or_skip("the Slurm test cluster runs slurmd and slurmctld as root")
    if not _tcp_reachable(MARIADB_HOST, MARIADB_PORT):
        require_or_skip(f"no MariaDB at {MARIADB_HOST}:{MARIADB_PORT} for slurmdbd")


def start_cluster_blocking() -> SlurmCluster:
    """Start every daemon, in order, each awaited by a fact it makes true; on failure stop
    what started and raise SlurmStartupError with the logs."""
    # Not pytest's tmp_path: munged wants every directory above its socket searchable by
    # all (pytest's base is 0700), and a UNIX socket path must stay under 108 bytes.
    base = Path(tempfile.mkdtemp(prefix="gfslurm-"))
    base.chmod(0o755)
    suffix = uuid.uuid4().hex[:8]
    cluster_name = f"gf{suffix}"
    database_name = f"gf_slurm_{suffix}"
    ports = {name: free_port() for name in ("slurmctld", "slurmdbd", *NODE_NAMES)}
    for directory in ("munge", "state", "spool", "run", "log", "restd"):
        (base / directory).mkdir()
    for node in NODE_NAMES:
        (base / "spool" / node).mkdir()
    (base / "munge").chmod(0o755)
    (base / "restd").chmod(0o755)
    job_dir = base / "jobs"
    job_dir.mkdir()
    job_dir.chmod(0o1777)
    _make_fake_gpus(base / "dev")
    conf_path = base / "slurm.conf"
    conf_path.write_text(_slurm_conf(base, cluster_name, ports))
    (base / "gres.conf").write_text(_gres_conf(base / "dev"))
    # slurmdbd reads slurmdbd.conf next to SLURM_CONF, and insists on mode 0600.
    dbd_conf = base / "slurmdbd.conf"
    dbd_conf.write_text(_slurmdbd_conf(base, database_name, ports["slurmdbd"]))
    dbd_conf.chmod(0o600)

    env = _slurm_env(conf_path)
    cluster = SlurmCluster(
        base_dir=base,
        cluster_name=cluster_name,
        database_name=database_name,
        conf_path=conf_path,
        env=env,
        restd_socket=base / "restd" / "slurmrestd.socket",
        job_dir=job_dir,
        ports=ports,
    )
    log = base / "log"

    def daemon(name: str, argv: list[str], log_name: str | None, **extra_env: str) -> _Daemon:
        log_path = log / log_name if log_name else None
        made = _Daemon(name, argv, log_path, log / f"{name}.out", {**env, **extra_env})
        cluster._daemons[name] = made
        return made

    munge = base / "munge"
    try:
        subprocess.run(
            ["mungekey", "--create", f"--keyfile={munge / 'munge.key'}"],
            check=True,
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        daemon(
            "munged",
            [
                "munged",
                "--foreground",
                f"--socket={munge / 'munge.socket'}",
                f"--key-file={munge / 'munge.key'}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={log / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
            "munged.log",
        ).start()
        cluster._wait(
            lambda: _munge_round_trip(munge / "munge.socket"), "munged encodes a credential"
        )

        daemon("slurmdbd", ["slurmdbd", "-D"], "slurmdbd.log").start()
        # Registering the cluster is both a step slurmctld needs and proof slurmdbd serves.
        cluster._wait(
            lambda: (
                cluster.run_blocking(
                    "sacctmgr", "-i", "add", "cluster", cluster_name, check=False
                ).returncode
                == 0
            ),
            "slurmdbd accepts `sacctmgr add cluster`",
        )

        daemon("slurmctld", ["slurmctld", "-D"], "slurmctld.log")
        cluster._daemons["slurmctld"].start()
        cluster._wait(cluster._slurmctld_answers, "slurmctld answers `scontrol ping`")

        for node in NODE_NAMES:
            daemon(node, ["slurmd", "-D", "-N", node], f"slurmd-{node}.log").start()
        cluster._wait(cluster._nodes_idle, f"nodes {', '.join(NODE_NAMES)} idle in sinfo")

        daemon(
            "slurmrestd",
            [
                "slurmrestd",
                "-a",
                "rest_auth/local",
                "-s",
                f"openapi/{REST_API_VERSION},openapi/db{REST_API_VERSION}",
                f"unix:{cluster.restd_socket}",
            ],
            None,  # it logs to stderr only
            # Else it refuses to run as root (or as SlurmUser, which is root here too).
            SLURMRESTD_SECURITY="disable_user_check",
        ).start()
        cluster._wait(cluster._restd_answers, "slurmrestd answers GET ping on its socket")
    except BaseException:
        stop_cluster_blocking(cluster)
        raise
    return cluster


def _munge_round_trip(socket_path: Path) -> bool:
    if not socket_path.exists():
        return False
    encoded = subprocess.run(
        ["munge", "-n", "-S", str(socket_path)], capture_output=True, timeout=10, check=False
    )
    return encoded.returncode == 0


def stop_cluster_blocking(cluster: SlurmCluster) -> None:
    """Stop in reverse order (jobs first, so no slurmstepd outlives its slurmd), drop the
    accounting database, remove the directory."""
    daemons = cluster._daemons
    try:
        if daemons.get("slurmctld") and daemons["slurmctld"].running:
            # Best effort: stopping slurmd below still ends what it can.
            with suppress(SlurmStartupError, SlurmCommandError, subprocess.TimeoutExpired):
                cluster.cancel_all_jobs_blocking()
        for name in reversed(list(daemons)):
            daemons[name].stop()
    finally:
        try:
            _mysql(f"DROP DATABASE IF EXISTS `{cluster.database_name}`")
        finally:
            shutil.rmtree(cluster.base_dir, ignore_errors=True)


@asynccontextmanager
async def slurm_cluster() -> AsyncIterator[SlurmCluster]:
    """A cluster of one's own for the duration of the block (a few seconds to start)."""
    require_slurm()
    cluster = await asyncio.to_thread(start_cluster_blocking)
    try:
        yield cluster
    finally:
        await asyncio.to_thread(stop_cluster_blocking, cluster)


# ---- pytest fixtures ----------------------------------------------------------------


@pytest.fixture(scope="session", name="slurm_session_cluster")
def slurm_session_cluster_fixture() -> Iterator[SlurmCluster]:
    """One cluster for the whole session; tests use `slurm`, which resets it between them."""
    require_slurm()
    cluster = start_cluster_blocking()
    try:
        yield cluster
    finally:
        stop_cluster_blocking(cluster)


@pytest.fixture(name="slurm")
def slurm_fixture(slurm_session_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster with slurmctld running and no jobs, before and after the test
    (a test may stop slurmctld; it is started again here)."""
    slurm_session_cluster.start_slurmctld_blocking()
    slurm_session_cluster.cancel_all_jobs_blocking()
    yield slurm_session_cluster
    slurm_session_cluster.start_slurmctld_blocking()
    slurm_session_cluster.cancel_all_jobs_blocking()
