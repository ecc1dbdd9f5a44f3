"""`greenfed edge doctor`: the checks that find what a failed install usually is, one
line each with the fix.

    ok    data-dir     /var/lib/greenfed writable
    FAIL  broker       mqtts://broker:8883: credentials refused
          fix: enrol the node again (greenfed edge enrol --api URL --token TOKEN)

`warn` is for what may be fine (no NVIDIA driver on a device without NVIDIA GPUs), `skip`
for a check that cannot run here (no API URL to read the time from). The exit status
is 1 when any check failed.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import ssl
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

import aiohttp
import aiomqtt
import msgspec
import psutil

from edge.sandbox.probe import NodeIsolation, probe_isolation
from edge.sandbox.setup import workers_memory_bytes, workers_work_root
from edge.upgrade.versions import DIRECTORY_NAME, stat_problem
from shared.desired_signature import PublicKeyError, load_public_key
from shared.enrolment_marker import read_marker
from shared.mqtt import MqttSession, check_tls_files, is_auth_failure
from shared.settings import ConfigError, Settings
from shared.topics import Topics

Verdict = Literal["ok", "warn", "skip", "FAIL"]
TIMEOUT_S = 5.0
MAX_CLOCK_SKEW_S = 5.0  # signed documents and telemetry are judged by wall clocks
ENROL_FIX = "enrol the node (greenfed edge enrol --api URL --token TOKEN)"
ISOLATION_FIX = (
    "run the agent as root with bubblewrap and util-linux installed (as "
    'deploy/edge/greenfed-agent.service does), or set agent.isolation = "none" to run '
    "work unisolated on a node whose operator trusts all of it"
)
CONTAINER_FIX = "apt install podman runc catatonit (docker works too)"


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    verdict: Verdict
    detail: str
    fix: str = ""


def check_data_dir(settings: Settings, *, euid: int | None = None) -> Check:
    """The data directory is writable, and by the agent's user only: the upgrade
    supervisor runs, as root, the agent versions unpacked there (agent-versions/), and
    the agent trusts its state/. `euid`: the agent's user (default: this process's)."""
    directory = settings.agent.resolved_data_dir()
    try:
        (directory / "state").mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.NamedTemporaryFile(dir=directory / "state", prefix=".doctor-"):
            pass
    except OSError as error:
        return Check(
            "data-dir",
            "FAIL",
            f"{directory} is not writable: {error.strerror or error}",
            f"give the agent's user the directory (chown -R greenfed: {directory}) "
            "or set agent.data_dir",
        )
    user = os.geteuid() if euid is None else euid
    exposed: list[tuple[Path, str]] = []
    # The data directory may be a link (to a larger disk); what it holds may not be:
    # the supervisor ignores a versions directory reached through one. Not recursive:
    # work/ holds the workers' own directories.
    for path, follow in (
        (directory, True),
        (directory / "state", False),
        (directory / DIRECTORY_NAME, False),
    ):
        try:
            status = path.stat() if follow else path.lstat()
        except FileNotFoundError:
            continue
        except OSError as error:
            exposed.append((path, f"it cannot be checked: {error.strerror or error}"))
            continue
        problem = stat_problem(status, owner=user, directory=True)
        if problem is not None:
            exposed.append((path, problem))
    if exposed:
        paths = " ".join(str(path) for path, _ in exposed)
        return Check(
            "data-dir",
            "FAIL",
            f"{'; '.join(f'{path}: {problem}' for path, problem in exposed)}: another user "
            "could change the agent's state, or swap in agent versions for the upgrade "
            "supervisor to run as root",
            "make each a directory of the agent's user, writable by it alone (the unit's "
            f"agent runs as root: chown root: {paths} && chmod go-w {paths})",
        )
    return Check("data-dir", "ok", f"{directory} writable, by the agent's user only")


def check_enrolment(settings: Settings) -> Check:
    key = settings.agent.control_plane_public_key
    if not key:
        return Check(
            "desired-key",
            "FAIL",
            "no control-plane public key: no desired state will be applied",
            ENROL_FIX,
        )
    try:
        load_public_key(key)
    except PublicKeyError as error:
        return Check("desired-key", "FAIL", f"agent.control_plane_public_key: {error}", ENROL_FIX)
    return Check("desired-key", "ok", "the control plane's public key is set")


def _agent_runs() -> bool:
    """Whether a `greenfed edge run` process runs on this host."""
    for process in psutil.process_iter(["cmdline"]):
        command = process.info.get("cmdline") or []
        words = [Path(word).name for word in command[:4]]
        if "edge" in command and "run" in command and any("greenfed" in w for w in words):
            return True
    return False


async def check_broker(
    settings: Settings, *, agent_runs: Callable[[], bool] = _agent_runs
) -> Check:
    mqtt = settings.mqtt
    node_id = settings.agent.resolved_node_id()
    # A broker that binds a node's account to its agent's client id (greenfed's
    # dynamic-security accounts are) refuses any other id: log in as the agent when
    # it is not running; beside a running agent that would take its session over.
    running = agent_runs()
    try:
        check_tls_files(mqtt)
    except ConfigError as error:  # its message names the setting and the file
        return Check(
            "broker",
            "FAIL",
            str(error),
            "put the file there (a missing bind-mount source or Secret key makes none), "
            "or correct the setting",
        )
    session = MqttSession(
        msgspec.structs.replace(mqtt, connect_timeout_s=TIMEOUT_S),
        client_id=(
            f"greenfed-doctor-{node_id}"
            if running
            else Topics(mqtt.topic_root).agent_client_id(node_id)
        ),
    )
    try:
        async with asyncio.timeout(TIMEOUT_S + 1.0), session.new_client():
            pass
    except aiomqtt.MqttError as error:
        if is_auth_failure(error) and running:
            return Check(
                "broker",
                "skip",
                f"{mqtt.url}: refused beside the running agent, whose client id the "
                f"account may be bound to ({error}); the agent's own connection is the "
                "check: greenfed nodes shows it online, or stop the agent and run this again",
            )
        if is_auth_failure(error):
            return Check(
                "broker",
                "FAIL",
                f"{mqtt.url}: credentials refused ({error})",
                "enrol the node again (greenfed edge enrol), or check mqtt.username and "
                "mqtt.password",
            )
        return Check(
            "broker",
            "FAIL",
            f"{mqtt.url}: not reachable ({error})",
            "check mqtt.url, that the broker runs and that the firewall lets this port "
            "through (mqtts: mqtt.tls_ca_file must hold its CA)",
        )
    except (TimeoutError, OSError, ssl.SSLError) as error:
        return Check(
            "broker",
            "FAIL",
            f"{mqtt.url}: not reachable ({error or 'timed out'})",
            "check mqtt.url, that the broker runs and that the firewall lets this port through",
        )
    return Check("broker", "ok", f"{mqtt.url} reachable, credentials accepted")


def check_nvml(settings: Settings) -> Check:
    if "nvidia" not in settings.agent.probes:
        return Check("nvml", "skip", "the nvidia probe is off (agent.probes)")
    try:
        import pynvml
    except ImportError:
        return Check(
            "nvml", "FAIL", "nvidia-ml-py is not installed", "pip install 'greenfed[edge]'"
        )
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return Check(
            "nvml",
            "warn",
            f"no NVIDIA driver ({error}): fine on a device without NVIDIA GPUs",
            "on a device with them, install the NVIDIA driver",
        )
    try:
        count = pynvml.nvmlDeviceGetCount()
        version = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    return Check("nvml", "ok", f"{count} NVIDIA GPU(s), driver {version}")


def check_power_limits(settings: Settings, gpus: int | None, *, euid: int | None = None) -> Check:
    """Whether the agent may hold GPUs to the power limits carbon-aware power capping
    asks for (NVML lets only root set them). `gpus`: NVIDIA GPUs NVML sees; `euid`:
    the user to judge (default: this process's)."""
    if not gpus:
        return Check("power-limits", "skip", "no NVIDIA GPUs to cap")
    if not settings.agent.runs_training:
        return Check("power-limits", "skip", "this node runs no training (agent.training_enabled)")
    user = os.geteuid() if euid is None else euid
    if user != 0:
        return Check(
            "power-limits",
            "warn",
            "the agent is not root, so NVML will refuse the GPU power limits power capping "
            "asks for: training runs at the default limit and reports why",
            "run the agent as root (a systemd drop-in with User=root), or turn capping off "
            "on the control plane ([scheduling] power_capping = false)",
        )
    return Check("power-limits", "ok", "root: GPU power limits can be set")


def check_onnxruntime(gpus: int | None) -> Check:
    """`gpus`: NVIDIA GPUs NVML sees (None: unknown)."""
    try:
        import onnxruntime
    except ImportError:
        return Check(
            "onnxruntime", "FAIL", "ONNX Runtime is not installed", "pip install 'greenfed[edge]'"
        )
    providers = onnxruntime.get_available_providers()
    detail = f"{onnxruntime.__version__}: {', '.join(providers)}"
    if gpus and "CUDAExecutionProvider" not in providers:
        return Check(
            "onnxruntime",
            "warn",
            f"{detail}; this machine has NVIDIA GPUs but this build cannot use them",
            "pip install onnxruntime-gpu (in place of onnxruntime)",
        )
    return Check("onnxruntime", "ok", detail)


async def check_clock(api_url: str | None) -> Check:
    if not api_url:
        return Check("clock", "skip", "no control-plane URL to compare with (not enrolled)")
    try:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            asked = time.time()
            async with http.get(f"{api_url.rstrip('/')}/healthz") as response:
                answered = time.time()
                date = response.headers.get("Date")
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        return Check("clock", "warn", f"could not ask {api_url} for its time ({error})")
    if not date:
        return Check("clock", "warn", f"{api_url} sent no Date header")
    theirs = email.utils.parsedate_to_datetime(date).timestamp()
    # The header has whole seconds: count the skew beyond the round trip and rounding.
    skew_s = theirs - (asked + answered) / 2
    if abs(skew_s) > MAX_CLOCK_SKEW_S + (answered - asked) + 1.0:
        return Check(
            "clock",
            "FAIL",
            f"{skew_s:+.0f} s off the control plane's clock",
            "synchronise the clock (timedatectl set-ntp true)",
        )
    return Check("clock", "ok", f"within {MAX_CLOCK_SKEW_S:.0f} s of the control plane's")


def node_isolation(settings: Settings) -> NodeIsolation | None:
    """What the agent would find (it makes the workers' root cgroups, as the agent does)."""
    if not settings.agent.runs_training:
        return None
    agent = settings.agent
    return probe_isolation(
        agent.isolation,
        cgroup_root=agent.cgroup_root,
        workers_memory_bytes=workers_memory_bytes(agent.reserved_memory_mib),
        runtime_setting=agent.container_runtime,
        oci_runtime=agent.oci_runtime,
    )


def check_isolation(settings: Settings, isolation: NodeIsolation | None) -> Check:
    """How this node would contain the training work sent to it (docs/isolation.md)."""
    if isolation is None:
        return Check("isolation", "skip", "this node runs no training (agent.training_enabled)")
    limits = ", ".join(isolation.limits) or "none"
    detail = f"{isolation.level}: {isolation.note}; limits: {limits}"
    if isolation.level == "sandbox":
        return Check("isolation", "ok", detail)
    if isolation.level == "user":
        return Check("isolation", "warn", detail, "apt install bubblewrap, for a sandbox too")
    if isolation.level == "none":
        return Check("isolation", "warn", detail, ISOLATION_FIX)
    return Check("isolation", "FAIL", f"training refused: {isolation.note}", ISOLATION_FIX)


WORK_DIR_FIX = (
    "set agent.work_dir to a directory on a filesystem of its own (a partition, volume "
    "or size-limited mount; with quotas per worker uid if tenants must not fill it for "
    "each other) and add it to the unit's ReadWritePaths"
)


def filesystem_of(path: Path, *, stat_path: Callable[[Path], os.stat_result] = os.stat) -> int:
    """The device id of the filesystem `path` is on, or would be made on: the nearest
    directory of it that exists (the work root is made with the first job)."""
    for candidate in (path, *path.parents):
        try:
            return stat_path(candidate).st_dev
        except FileNotFoundError:
            continue
    raise FileNotFoundError(path)


def check_work_dir(
    settings: Settings,
    isolation: NodeIsolation | None,
    *,
    stat_path: Callable[[Path], os.stat_result] = os.stat,
) -> Check:
    """Whether a job filling its work directory fills the agent's disk too: nothing
    limits what a worker writes there, and a full data directory costs the agent its
    state and outbox writes and turns every other job away (docs/isolation.md)."""
    if isolation is None:
        return Check("work-dir", "skip", "this node runs no training (agent.training_enabled)")
    agent = settings.agent
    try:
        work_root = workers_work_root(agent)
    except ConfigError as error:
        return Check("work-dir", "FAIL", str(error), "set agent.work_dir to a directory of its own")
    if isolation.level not in ("sandbox", "user"):
        return Check("work-dir", "skip", f"isolation {isolation.level}: workers are not contained")
    data_dir = agent.resolved_data_dir()
    try:
        shared = filesystem_of(work_root, stat_path=stat_path) == filesystem_of(
            data_dir, stat_path=stat_path
        )
    except OSError as error:
        return Check("work-dir", "warn", f"{work_root}: cannot be checked ({error})", WORK_DIR_FIX)
    if shared:
        return Check(
            "work-dir",
            "warn",
            f"{work_root} is on the filesystem of the data directory {data_dir}: a job that "
            "fills its work directory fills the agent's disk, whose state and outbox "
            "writes then fail, and no other job can start here",
            WORK_DIR_FIX,
        )
    return Check("work-dir", "ok", f"{work_root}, on a filesystem apart from the data directory")


def check_containers(isolation: NodeIsolation | None) -> Check:
    """Whether work that names an image can run here, and what this host needs of the
    runtime (crun refuses hybrid cgroup hosts; an init so containers stop on SIGTERM)."""
    if isolation is None:
        return Check("containers", "skip", "this node runs no training")
    runtime = isolation.runtime
    if runtime is None:
        return Check(
            "containers",
            "warn",
            f"no container runtime ({isolation.runtime_note}): work that names an image "
            "is not placed here",
            CONTAINER_FIX,
        )
    detail = isolation.runtime_note
    if runtime.oci_runtime == "runc" and isolation.cgroups and isolation.cgroups.layout.hybrid:
        detail += " (crun refuses this host's hybrid cgroup layout)"
    if not runtime.has_init:
        return Check(
            "containers",
            "warn",
            f"{detail}; no init for containers: a stopped job gets SIGKILL after its grace "
            "period instead of SIGTERM",
            "apt install catatonit",
        )
    if not runtime.cdi_gpus:
        detail += "; GPUs passed as device nodes (no NVIDIA CDI spec)"
    # Never the runtime's defaults, which may exceed this host's hard limits.
    detail += (
        "; ulimits: the agent's open files and process count (the worker's cgroup holds "
        "its pids limit)"
    )
    return Check("containers", "ok", detail)


def check_private_files(settings: Settings, config_path: Path | None) -> Check:
    """Files a worker must not read are kept from it by their modes too."""
    exposed = []
    for path in (config_path, settings.agent.resolved_data_dir() / "state"):
        if path is None:
            continue
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            continue
        if mode & (stat.S_IRGRP | stat.S_IROTH | stat.S_IWOTH):
            exposed.append(f"{path} (mode {stat.S_IMODE(mode):04o})")
    if exposed:
        return Check(
            "private-files",
            "FAIL",
            f"readable by others: {', '.join(exposed)}; a job could read the node's "
            "broker password or keys",
            "chmod 600 the settings file and chmod 700 the state directory",
        )
    return Check("private-files", "ok", "the settings and the agent's state are its own")


async def run_checks(
    settings: Settings, api_url: str | None, config_path: Path | None = None
) -> list[Check]:
    nvml = await asyncio.to_thread(check_nvml, settings)
    gpus = int(nvml.detail.split()[0]) if nvml.verdict == "ok" else None
    isolation = await asyncio.to_thread(node_isolation, settings)
    return [
        await asyncio.to_thread(check_data_dir, settings),
        await asyncio.to_thread(check_private_files, settings, config_path),
        check_enrolment(settings),
        await check_broker(settings),
        nvml,
        check_power_limits(settings, gpus),
        check_isolation(settings, isolation),
        await asyncio.to_thread(check_work_dir, settings, isolation),
        check_containers(isolation),
        await asyncio.to_thread(check_onnxruntime, gpus),
        await check_clock(api_url),
    ]


def print_checks(checks: Sequence[Check], out: TextIO | None = None) -> int:
    out = out or sys.stdout
    width = max(len(check.name) for check in checks)
    for check in checks:
        out.write(f"{check.verdict:<5} {check.name:<{width}}  {check.detail}\n")
        if check.fix and check.verdict in ("FAIL", "warn"):
            out.write(f"{'':<5} {'':<{width}}  fix: {check.fix}\n")
    return 1 if any(check.verdict == "FAIL" for check in checks) else 0


def enrolled_api_url(config: Path | None) -> str | None:
    """The control plane's URL `greenfed edge enrol` recorded in the settings file."""
    if config is None:
        return None
    try:
        marker = read_marker(config.read_text(encoding="utf-8"))
    except OSError:
        return None
    return marker.api if marker else None
