"""Which ONNX Runtime execution providers this machine can offer, per device family.

An accelerator advertises only providers that the installed ONNX Runtime build
really offers: the cloud must not place an OpenVINO model on a node whose ORT
wheel has no OpenVINO provider, even if an Intel NPU sits in it.

"Offers" means compiled into the build (`get_available_providers`). A provider
may still fail at session creation (e.g. CUDA libraries missing); the inference
server falls back then, discovery does not try to build sessions.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Literal

import structlog

log = structlog.get_logger(__name__)

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
        import onnxruntime

        providers = onnxruntime.get_available_providers()
    except Exception as error:  # a broken wheel can raise anything at import
        log.info("onnxruntime unavailable; no execution providers", error=repr(error))
        return ()
    return tuple(str(provider) for provider in providers)


def providers_for(family: DeviceFamily, available: Sequence[str] | None = None) -> tuple[str, ...]:
    """The providers usable on a device of `family`, best first.

    `available` is what the ORT build offers; None asks the installed onnxruntime.
    """
    offered = set(available_onnx_providers() if available is None else available)
    return tuple(provider for provider in _PREFERRED_PROVIDERS[family] if provider in offered)
