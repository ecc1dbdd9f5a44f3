"""Container runtimes: work that names an OCI image runs in it, with podman or docker.

What the node has is found once, at the agent's start (`find_runtime`); the command
lines for one worker are built here and run by the wrapper (edge/training/wrapper.py):

- the image is made present first, as the job's `image_pull_policy` says: `never`
  only checks that it is there, `if-not-present` pulls it when it is not, `always`
  pulls it; private registries' credentials (sealed to this node) go to the runtime
  in an auth file readable by root only, deleted once the pull is over;
- the container runs as the job's work user (`--user uid:gid`), with no capabilities
  and no_new_privs, the host's network (gangs rendezvous over it), the worker's work
  directory mounted read-write (and nothing else of the host), exactly the assigned
  GPUs (CDI names where an NVIDIA CDI spec is installed, else their device nodes),
  the node's own open-files limit and as many processes as the kernel has pids as
  ulimits (a runtime's defaults may exceed the host's hard limits, and then no
  container starts; the worker's pids limit is its cgroup's, never an nproc ulimit,
  which counts the user's processes host-wide) and the job's environment, passed by
  name from the runtime client's own environment so that no value, secret or not, is
  ever on a command line (`/proc/<pid>/cmdline` is readable by everyone);
- podman is told to use cgroupfs and the worker's leaf as the container's parent
  group, so the worker's limits hold the container and its out-of-memory kills are
  counted where the agent reads them; docker, whose daemon decides the cgroup layout,
  gets the limits as its own flags and is asked after the run whether it killed the
  container for memory.

Nothing here runs a process but `find_runtime`, which probes, and `local_names`, which
asks the store what an image reference finds: building command lines is pure.
"""

from __future__ import annotations

import base64
import json
import resource
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from edge.sandbox.devices import DeviceNode
from edge.sandbox.users import WorkUser
from shared.messages import Accelerator, ImagePullPolicy

RuntimeName = Literal["podman", "docker"]
PROBE_TIMEOUT_S: Final = 10.0
CDI_DIRS: Final = (Path("/etc/cdi"), Path("/var/run/cdi"))
PID_MAX_FILE: Final = Path("/proc/sys/kernel/pid_max")
# Where podman and docker look for the init they run as PID 1 with --init.
INIT_BINARIES: Final = (
    Path("/usr/libexec/podman/catatonit"),
    Path("/usr/bin/catatonit"),
    Path("/usr/bin/docker-init"),
    Path("/usr/libexec/docker/docker-init"),
)


@dataclass(frozen=True, slots=True)
class ContainerRuntime:
    name: RuntimeName
    binary: str
    version: str
    oci_runtime: str = ""  # the OCI runtime asked for (podman --runtime); "": its default
    cdi_gpus: bool = False  # an NVIDIA CDI spec is installed: GPUs by CDI name
    # An init for the container's PID 1 (catatonit, tini) is installed: the command then
    # gets SIGTERM on stop (a PID 1 without a handler never would, and waits for SIGKILL).
    has_init: bool = False

    @property
    def _global(self) -> list[str]:
        argv = [self.binary]
        if self.name == "podman":
            # Our own cgroup tree, wherever the host's default manager would put it.
            argv.append("--cgroup-manager=cgroupfs")
            if self.oci_runtime:
                argv.append(f"--runtime={self.oci_runtime}")
        return argv

    def exists_argv(self, image: str) -> list[str]:
        if self.name == "podman":
            return [*self._global, "image", "exists", image]
        return [*self._global, "image", "inspect", "--format", "{{.Id}}", image]

    def pull_argv(self, image: str, auth_path: str | None) -> list[str]:
        if self.name == "podman":
            auth = [f"--authfile={auth_path}"] if auth_path else []
            return [*self._global, "pull", *auth, image]
        config = [f"--config={Path(auth_path).parent}"] if auth_path else []
        return [self.binary, *config, "pull", image]

    def names_argv(self, image: str) -> list[str]:
        """Prints every name (tags, then digests) of the local image `image` finds, one
        a line; fails when it finds none."""
        names = "{{range .RepoTags}}{{println .}}{{end}}{{range .RepoDigests}}{{println .}}{{end}}"
        return [*self._global, "image", "inspect", "--format", names, image]

    def auth_file_name(self) -> str:
        """docker reads `config.json` in the directory it is given; podman any file."""
        return "config.json" if self.name == "docker" else "auth.json"

    def run_argv(
        self,
        *,
        container: str,
        image: str,
        command: Sequence[str],
        user: WorkUser,
        env_names: Sequence[str],
        env_values: Mapping[str, str],
        work_dir: str,
        cwd: str | None,
        cgroup_parent: str | None,
        memory_bytes: int | None,
        cpu_cores: float | None,
        pids: int | None,
        gpus: Sequence[Accelerator],
        devices: Sequence[DeviceNode],
    ) -> list[str]:
        argv = [
            *self._global,
            "run",
            f"--name={container}",
            "--pull=never",
            f"--user={user.uid}:{user.gid}",
            "--cap-drop=all",
            "--security-opt=no-new-privileges",
            "--network=host",
            *(["--init"] if self.has_init else []),
            f"--volume={work_dir}:{work_dir}:rw",
            f"--workdir={cwd or work_dir}",
            *_ulimits(),
        ]
        if self.name == "podman" and cgroup_parent is not None:
            argv.append(f"--cgroup-parent={cgroup_parent}")
            # The leaf holds the worker's processes, but podman gives its container a
            # group of its own below it, with podman's default (2048) unless told.
            argv.append(f"--pids-limit={pids if pids is not None else -1}")
        else:  # docker: its daemon's cgroups, held by its own flags
            if memory_bytes is not None:
                argv += [f"--memory={memory_bytes}", f"--memory-swap={memory_bytes}"]
            if cpu_cores is not None:
                argv.append(f"--cpus={cpu_cores:g}")
            if pids is not None:
                argv.append(f"--pids-limit={pids}")
        if self.cdi_gpus and gpus and all(g.parent_id is None for g in gpus):
            argv += [f"--device=nvidia.com/gpu={g.index}" for g in gpus if g.index is not None]
        else:
            argv += [f"--device={d.path}:{d.inside}" for d in devices]
        argv += [f"--env={name}" for name in env_names]
        # Root-sensitive variables (edge/sandbox/root_env.py): not in the client's own
        # environment, so given as values.
        argv += [f"--env={name}={value}" for name, value in sorted(env_values.items())]
        argv += ["--", image, *command]
        return argv

    def oom_argv(self, container: str) -> list[str]:
        """Prints `true` when the runtime killed the container for memory."""
        return [*self._global, "inspect", "--format", "{{.State.OOMKilled}}", container]

    def remove_argv(self, container: str) -> list[str]:
        return [*self._global, "rm", "--force", container]


# The key the docker CLI looks Docker Hub's credentials up by (podman takes docker.io).
_DOCKER_HUB_KEY: Final = "https://index.docker.io/v1/"
_DOCKER_HUB_NAMES: Final = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})


def auth_file(registry: str, username: str, password: str) -> bytes:
    """The credentials file both runtimes read (`auths`, base64 of user:password). For
    Docker Hub under docker's key too: docker sent no credentials for `docker.io`."""
    token = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
    keys = [registry, _DOCKER_HUB_KEY] if registry in _DOCKER_HUB_NAMES else [registry]
    return json.dumps({"auths": {key: {"auth": token} for key in keys}}).encode()


def pull_needed(policy: ImagePullPolicy) -> tuple[bool, bool]:
    """(check first whether it is there, pull when it is not / always)."""
    if policy == "never":
        return True, False
    if policy == "always":
        return False, True
    return True, True


def local_names(runtime: ContainerRuntime, image: str, env: Mapping[str, str]) -> list[str]:
    """The names of the image in the runtime's store that `image` finds (none: it finds
    none, or the runtime does not answer). Blocking: it asks the runtime."""
    answer = _answer(runtime.names_argv(image), env)
    return [line.strip() for line in answer.splitlines() if line.strip()]


def _ulimits() -> list[str]:
    """Open files as the agent has them; processes as many as the kernel has process
    ids (a count no user can reach: no limit in effect). Never the runtime's defaults,
    which may exceed the host's hard limits (then no container starts at all): podman
    lowers its own to pid_max, and without CAP_SYS_RESOURCE nothing above it is set.

    Never the worker's pids limit as its nproc: RLIMIT_NPROC counts every process of
    the user on the host, its other jobs' too (the same tenant's, or every tenant's
    with `agent.worker_user`), so a job running that many would keep the next one of
    the user from starting. The worker's cgroup holds its own processes: podman's
    container is under the worker's leaf (pids.max), docker gets --pids-limit."""
    flags = []
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        soft = hard if soft == resource.RLIM_INFINITY else soft
        flags.append(f"--ulimit=nofile={soft}:{hard}")
    processes = _pid_max()
    _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if hard != resource.RLIM_INFINITY:
        processes = min(processes, hard) if processes is not None else hard
    if processes is not None:
        flags.append(f"--ulimit=nproc={processes}:{processes}")
    return flags


def _pid_max() -> int | None:
    try:
        return int(PID_MAX_FILE.read_text(encoding="ascii"))
    except (OSError, ValueError):
        return None


def _cdi_has_nvidia_gpus(directories: Sequence[Path] = CDI_DIRS) -> bool:
    for directory in directories:
        try:
            specs = list(directory.iterdir())
        except OSError:
            continue
        for spec in specs:
            try:
                if "nvidia.com/gpu" in spec.read_text(encoding="utf-8", errors="replace"):
                    return True
            except OSError:
                continue
    return False


@dataclass(frozen=True, slots=True)
class RuntimeProbe:
    runtime: ContainerRuntime | None
    note: str  # why there is none, or what it is


def find_runtime(
    wanted: Literal["auto", "podman", "docker", "none"],
    oci_runtime: str = "",
    environ: Mapping[str, str] | None = None,
    *,
    hybrid_cgroups: bool = False,
) -> RuntimeProbe:
    """The runtime that will run images here (blocking: it asks the runtime).
    `hybrid_cgroups`: v1 controllers beside a v2 tree, which crun refuses: podman is
    then told to use runc when it would use crun."""
    if wanted == "none":
        return RuntimeProbe(None, "agent.container_runtime = none")
    names: tuple[RuntimeName, ...] = ("podman", "docker") if wanted == "auto" else (wanted,)
    notes = []
    for name in names:
        binary = shutil.which(name, path=(environ or {}).get("PATH"))
        if binary is None:
            notes.append(f"{name} is not installed")
            continue
        probe = _probe(name, binary, oci_runtime, hybrid_cgroups)
        if isinstance(probe, ContainerRuntime):
            oci = f" with {probe.oci_runtime}" if probe.oci_runtime else ""
            return RuntimeProbe(probe, f"{name} {probe.version}{oci}")
        notes.append(probe)
    return RuntimeProbe(None, "; ".join(notes))


def _probe(
    name: RuntimeName, binary: str, oci_runtime: str, hybrid_cgroups: bool
) -> ContainerRuntime | str:
    version_format = "{{.Client.Version}}"
    try:
        done = subprocess.run(
            [binary, "version", "--format", version_format],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{name} does not answer ({error})"
    if done.returncode != 0:
        return f"{name} does not work here: {_last_line(done.stderr or done.stdout)}"
    if name == "podman" and not oci_runtime and hybrid_cgroups:
        default = _answer([binary, "info", "--format", "{{.Host.OCIRuntime.Name}}"]).strip()
        if default == "crun":
            if shutil.which("runc") is None:
                return (
                    "podman's OCI runtime crun refuses this host's hybrid cgroup layout: "
                    "install runc (apt install runc)"
                )
            oci_runtime = "runc"  # crun: "cgroups in hybrid mode not supported"
    runtime = ContainerRuntime(
        name=name,
        binary=binary,
        version=done.stdout.strip() or "?",
        oci_runtime=oci_runtime if name == "podman" else "",
        cdi_gpus=_cdi_has_nvidia_gpus(),
        has_init=any(path.exists() for path in INIT_BINARIES),
    )
    if name == "podman" and oci_runtime and shutil.which(oci_runtime) is None:
        return f"agent.oci_runtime {oci_runtime!r} is not installed"
    return runtime


def _answer(argv: list[str], env: Mapping[str, str] | None = None) -> str:
    """What a probe printed, or "" where it failed or did not answer in time."""
    try:
        done = subprocess.run(
            argv,
            env=None if env is None else dict(env),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"
