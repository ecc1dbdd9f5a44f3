"""A training node's sandbox, set up once from the agent's settings when it starts.

The order matters and is here in one place: the agent's own files are made private
first (its data directory can be passed through, never listed; state, logs and models
are its own), then what the node can do is probed (edge/sandbox/probe.py), then whom
workers run as is settled (edge/sandbox/users.py), and the node's sealing key is
loaded or made (edge/sealing_key.py). Blocking: the agent runs it in a thread.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import psutil

from edge.sandbox.image_owners import ImageOwners
from edge.sandbox.launcher import PrivatePaths, Sandbox
from edge.sandbox.probe import NodeIsolation, probe_isolation
from edge.sandbox.users import WorkUsers
from edge.sealing_key import load_or_create_sealing_key, sealing_key_path
from shared.messages import Accelerator
from shared.settings import AgentSettings, ConfigError, Settings, work_dir_problem

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

MIB: Final = 1024**2
# Under the agent's data directory (edge/training/process.py and the agent's modules).
# Workers' work directories are elsewhere: agent.work_dir (AgentSettings.resolved_work_dir).
JOBS_DIR: Final = "jobs"
CREDENTIALS_DIR: Final = "credentials"
PRIVATE_SUBDIRS: Final = ("state", JOBS_DIR, "models", CREDENTIALS_DIR)
WORKER_UIDS_FILE: Final = "worker-uids.json"
IMAGE_OWNERS_FILE: Final = "image-owners.json"


@dataclass(frozen=True, slots=True)
class TrainingSetup:
    isolation: NodeIsolation
    users: WorkUsers | None
    sealing_key: X25519PrivateKey
    private: PrivatePaths
    data_dir: Path
    # Where workers' work directories are made (agent.work_dir; default data_dir/work).
    work_root: Path

    def sandbox(self, inventory: tuple[Accelerator, ...], default_pids: int) -> Sandbox:
        return Sandbox(
            self.isolation,
            inventory=inventory,
            work_root=self.work_root,
            credentials_dir=self.data_dir / CREDENTIALS_DIR,
            users=self.users,
            private=self.private,
            default_pids=default_pids,
            image_owners=ImageOwners(self.data_dir / "state" / IMAGE_OWNERS_FILE),
        )


def secure_data_dir(data_dir: Path) -> None:
    """Others may pass through the data directory to their work directory, never read
    it; what the agent keeps is its own. Only where the agent owns them."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for name in PRIVATE_SUBDIRS:
        (data_dir / name).mkdir(exist_ok=True)
    for path, mode in ((data_dir, 0o711), *((data_dir / n, 0o700) for n in PRIVATE_SUBDIRS)):
        with contextlib.suppress(OSError):
            if path.stat().st_uid == os.geteuid():
                os.chmod(path, mode)


def workers_work_root(agent: AgentSettings) -> Path:
    """Where workers' work directories are made: `agent.work_dir`, else data_dir/work
    as it always was. One the operator names is used by its real path (it may be a
    link to another disk): a sandbox hides it by that path and must find each work
    directory below it to make its parents passable (edge/sandbox/bubblewrap.py).
    Raises ConfigError naming agent.work_dir for one that holds the agent's files
    once links are followed (the settings judged only the text)."""
    if not agent.work_dir:
        return agent.resolved_work_dir()
    root = os.path.realpath(agent.resolved_work_dir())
    problem = work_dir_problem(root, os.path.realpath(agent.resolved_data_dir()))
    if problem is not None:
        raise ConfigError(f"agent.work_dir: {problem}", key="agent.work_dir")
    return Path(root)


def private_paths(settings: Settings, config_path: Path | None) -> PrivatePaths:
    """What workers must never see: the data directory, the settings file, the broker
    credentials' files, and what the operator adds (`agent.hidden_paths`). Work
    directories kept outside the data directory (`agent.work_dir`) are hidden as the
    default ones inside it are: a sandbox sees its own work directory, no other's."""
    data_dir = settings.agent.resolved_data_dir()
    directories = [data_dir]
    work_root = workers_work_root(settings.agent)
    if not work_root.resolve().is_relative_to(data_dir.resolve()):
        directories.append(work_root)
    files = [config_path] if config_path is not None else []
    for name in (settings.mqtt.tls_key_file, settings.mqtt.tls_cert_file):
        if name:
            files.append(Path(name))
    for text in settings.agent.hidden_paths:
        path = Path(text)
        (directories if path.is_dir() else files).append(path)
    return PrivatePaths(
        directories=tuple(p.resolve() for p in directories),
        files=tuple(p.resolve() for p in files),
    )


def workers_memory_bytes(reserved_mib: int) -> int | None:
    """All workers together: the host's memory less what the agent and the system keep."""
    if reserved_mib <= 0:
        return None
    return max(64 * MIB, psutil.virtual_memory().total - reserved_mib * MIB)


def set_up_training(settings: Settings, config_path: Path | None) -> TrainingSetup:
    """Raises WorkUserError or ConfigError for settings that cannot be used."""
    agent = settings.agent
    data_dir = agent.resolved_data_dir()
    secure_data_dir(data_dir)
    isolation = probe_isolation(
        agent.isolation,
        cgroup_root=agent.cgroup_root,
        workers_memory_bytes=workers_memory_bytes(agent.reserved_memory_mib),
        runtime_setting=agent.container_runtime,
        oci_runtime=agent.oci_runtime,
    )
    users = None
    if isolation.switches_user:
        users = WorkUsers(
            configured=agent.worker_user,
            uid_range=agent.worker_uid_range,
            map_path=data_dir / "state" / WORKER_UIDS_FILE,
        )
    return TrainingSetup(
        isolation=isolation,
        users=users,
        sealing_key=load_or_create_sealing_key(sealing_key_path(agent)),
        private=private_paths(settings, config_path),
        data_dir=data_dir,
        work_root=workers_work_root(agent),
    )
