"""Which ONNX Runtime execution providers this machine can offer, per device family.

An accelerator advertises only providers that the installed ONNX Runtime build
really offers: the cloud must not place an OpenVINO model on a node whose ORT
wheel has no OpenVINO provider, even if an Intel NPU sits in it.

"Offers" means compiled into the build (`get_available_providers`). A provider
may still fail at session creation (e.g. CUDA libraries missing); the inference
server falls back then, discovery does not try to build sessions.

The question is asked in a short-lived child process: importing ONNX Runtime
costs an agent about 30 MB of resident memory, which an agent that serves no
model should not carry for the rest of its life.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Literal

from shared.lean_logs import get_logger

log = get_logger(__name__)

DeviceFamily = Literal[
    "cpu",
    "nvidia",
    "intel-npu",
    "amd-npu",
    "qualcomm-npu",
    "huawei-npu",
    "rockchip-npu",
    "coral",
    "hailo",
]

PROBE_TIMEOUT_S = 30.0
_PROBE_SCRIPT = "import json, onnxruntime; print(json.dumps(onnxruntime.get_available_providers()))"

# Best first. CPUExecutionProvider belongs to the CPU alone: listing it on a GPU or
# NPU would let the scheduler place work there that silently runs on the host.
# Coral Edge TPU and Hailo have no ONNX Runtime execution provider (they run their
# own compiled formats through libedgetpu / HailoRT), so they offer none.
_PREFERRED_PROVIDERS: dict[DeviceFamily, tuple[str, ...]] = {
    "cpu": ("CPUExecutionProvider",),
    "nvidia": ("TensorrtExecutionProvider", "CUDAExecutionProvider"),
    "intel-npu": ("OpenVINOExecutionProvider",),
    "amd-npu": ("VitisAIExecutionProvider",),
    "qualcomm-npu": ("QNNExecutionProvider",),
    "huawei-npu": ("CANNExecutionProvider",),
    "rockchip-npu": ("RknpuExecutionProvider",),
    "coral": (),
    "hailo": (),
}


@functools.cache
def available_onnx_providers() -> tuple[str, ...]:
    """The execution providers of the installed ONNX Runtime build, in its own order.

    Empty when onnxruntime is missing or broken: the agent still runs and reports
    its devices, they just cannot take ONNX inference work.
    """
    try:
        probe = subprocess.run(
            [sys.executable, "-c", _PROBE_SCRIPT],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
        providers = json.loads(probe.stdout) if probe.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError) as error:
        providers, reason = None, repr(error)
    else:
        reason = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "no output"
    if not isinstance(providers, list):
        # Missing or broken wheel: the agent still runs and reports its devices,
        # they just cannot take ONNX inference work.
        log.info("onnxruntime unavailable; no execution providers", error=reason)
        return ()
    return tuple(str(provider) for provider in providers)


def providers_for(family: DeviceFamily, available: Sequence[str] | None = None) -> tuple[str, ...]:
    """The providers usable on a device of `family`, best first.

    `available` is what the ORT build offers; None asks the installed onnxruntime.
    """
    offered = set(available_onnx_providers() if available is None else available)
    return tuple(provider for provider in _PREFERRED_PROVIDERS[family] if provider in offered)
