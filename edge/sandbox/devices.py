"""Which device nodes a worker may open: the standard ones every process needs, and
those of the accelerators it was given, never another job's.

An NVIDIA GPU is used through `/dev/nvidia<index>` plus the driver's shared nodes
(`nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`, `nvidia-modeset`); a MIG instance
through its parent GPU's node and `/dev/nvidia-caps` (which instance a process may
use is then CUDA's to enforce, by the MIG UUID in CUDA_VISIBLE_DEVICES); an NPU with
an index through `/dev/accel/accel<index>`. Nodes that do not exist on this host are
left out (a GPU we do not have is not an error here: it is the scheduler's).

The same list serves three mechanisms: a sandbox binds exactly these nodes into its
own /dev (edge/sandbox/bubblewrap.py), a container gets them as devices
(edge/sandbox/containers.py), and on cgroup v1 the devices controller allows only them
(`device_rules`), so a worker that ignores CUDA_VISIBLE_DEVICES still cannot open a
GPU it was not given.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from shared.messages import Accelerator

NVIDIA_SHARED_NODES: Final = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
NVIDIA_CAPS_DIR: Final = "nvidia-caps"
# What any process expects to open (those bubblewrap's own /dev and containers provide):
# null, zero, full, random, urandom, tty, ptmx and the pseudo-terminals; mknod of any
# node is allowed, opening one is not.
STANDARD_DEVICE_RULES: Final = (
    "c *:* m",
    "b *:* m",
    "c 1:3 rwm",
    "c 1:5 rwm",
    "c 1:7 rwm",
    "c 1:8 rwm",
    "c 1:9 rwm",
    "c 5:0 rwm",
    "c 5:2 rwm",
    "c 136:* rwm",
)


@dataclass(frozen=True, slots=True)
class DeviceNode:
    path: str  # on this host
    inside: str  # where the worker sees it: under /dev
    kind: str  # "c" (character) or "b" (block)
    major: int
    minor: int

    @property
    def rule(self) -> str:
        return f"{self.kind} {self.major}:{self.minor} rwm"


def _node(path: Path, dev_root: Path) -> DeviceNode | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    if stat.S_ISCHR(info.st_mode):
        kind = "c"
    elif stat.S_ISBLK(info.st_mode):
        kind = "b"
    else:
        return None
    inside = "/dev/" + str(path.relative_to(dev_root))
    return DeviceNode(str(path), inside, kind, os.major(info.st_rdev), os.minor(info.st_rdev))


def assigned_device_nodes(
    assigned_ids: Sequence[str], inventory: Sequence[Accelerator], dev_root: Path = Path("/dev")
) -> tuple[DeviceNode, ...]:
    """The device nodes through which the accelerators `assigned_ids` are used, that
    exist under `dev_root` (a test points it at nodes it made)."""
    by_id = {accelerator.id: accelerator for accelerator in inventory}
    paths: list[Path] = []
    any_gpu = any_mig = False
    for accelerator_id in assigned_ids:
        accelerator = by_id.get(accelerator_id)
        if accelerator is None:
            continue
        if accelerator.kind == "gpu":
            any_gpu = True
            index = accelerator.index
            if accelerator.parent_id is not None:
                any_mig = True
                parent = by_id.get(accelerator.parent_id)
                index = parent.index if parent is not None else None
            if index is not None:
                paths.append(dev_root / f"nvidia{index}")
        elif accelerator.kind == "npu" and accelerator.index is not None:
            paths.append(dev_root / "accel" / f"accel{accelerator.index}")
    if any_gpu:
        paths.extend(dev_root / name for name in NVIDIA_SHARED_NODES)
    if any_mig and (dev_root / NVIDIA_CAPS_DIR).is_dir():
        paths.extend(sorted((dev_root / NVIDIA_CAPS_DIR).iterdir()))
    nodes = (_node(path, dev_root) for path in dict.fromkeys(paths))
    return tuple(node for node in nodes if node is not None)


def device_rules(nodes: Sequence[DeviceNode]) -> tuple[str, ...]:
    """cgroup v1 devices.allow lines: the standard devices and `nodes`."""
    return (*STANDARD_DEVICE_RULES, *dict.fromkeys(node.rule for node in nodes))
