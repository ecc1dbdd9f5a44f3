"""Device profiles for simulated nodes, with figures from vendor data sheets.

relative_speed is throughput relative to one NVIDIA A100 (1.0) on mixed
training/inference work; it is a planning figure, not a benchmark. Power is per
accelerator: idle is what an idle, powered device draws, max its board power
(TDP / configurable power mode ceiling). The GPUs' figures are those of
shared.accelerators, the table discovery and the scheduler benchmark read too;
the host CPUs' are each machine's own. Sources, per profile, in `source`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shared.accelerators import ACCELERATORS, lowest_power_share, required
from shared.messages import Accelerator, AcceleratorKind

GIB = 1024**3

NVIDIA_GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
# What one core of the machine running the simulation counts as (A100 = 1.0).
HOST_CORE_RELATIVE_SPEED = 0.01
CPU_PROVIDERS = ("CPUExecutionProvider",)


@dataclass(frozen=True, slots=True)
class AcceleratorProfile:
    kind: AcceleratorKind
    vendor: str
    model: str
    count: int
    memory_bytes: int
    compute_units: int
    idle_power_w: float
    max_power_w: float
    relative_speed: float
    onnx_providers: tuple[str, ...]
    # A card on the PCI bus, which discovery reports at its PCI address (NVML's
    # busId); a Jetson's GPU is part of its system-on-chip.
    on_pci: bool = False
    # Each of these GPUs runs in MIG mode, cut into as many instances of this profile
    # ("1g.10gb": seven) as its compute allows; None: whole GPUs.
    mig_profile: str | None = None


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    name: str
    description: str
    cpu_model: str
    cpu_vendor: str
    cpu_cores: int
    cpu_idle_power_w: float
    cpu_max_power_w: float
    cpu_relative_speed: float
    memory_bytes: int
    arch: str
    accelerators: tuple[AcceleratorProfile, ...]
    source: str
    # Mean accelerator utilisation the random walk drifts around (0..1).
    typical_utilization: float = 0.35

    @property
    def inference_latency_scale(self) -> float:
        """Simulated devices serve on this machine's CPU; their reported latency is
        scaled by how much slower (or faster) the profile's fastest device is than one
        server core (relative speed 0.01 on the A100 = 1.0 scale)."""
        fastest = max([self.cpu_relative_speed, *(a.relative_speed for a in self.accelerators)])
        return HOST_CORE_RELATIVE_SPEED / fastest


def _gpu(name: str, count: int, *, integrated: bool = False) -> AcceleratorProfile:
    """`count` of the NVIDIA GPU filed under `name` in shared.accelerators; `integrated`:
    part of the system-on-chip, not a card on the PCI bus."""
    facts = ACCELERATORS[name]
    return AcceleratorProfile(
        kind=facts.kind,
        vendor=facts.vendor,
        model=facts.name,
        count=count,
        memory_bytes=required(facts.memory_bytes, facts, "memory"),
        compute_units=required(facts.compute_units, facts, "compute units"),
        idle_power_w=required(facts.idle_power_w, facts, "idle power"),
        max_power_w=required(facts.max_power_w, facts, "maximum power"),
        relative_speed=required(facts.relative_speed, facts, "relative speed"),
        onnx_providers=NVIDIA_GPU_PROVIDERS,
        on_pci=not integrated,
    )


def _npu(name: str, *, onnx_providers: tuple[str, ...], model: str = "") -> AcceleratorProfile:
    """One NPU filed under `name` in shared.accelerators (shown as `model`, when the
    device reports itself under another name than the table files it by)."""
    facts = ACCELERATORS[name]
    return AcceleratorProfile(
        kind=facts.kind,
        vendor=facts.vendor,
        model=model or facts.name,
        count=1,
        memory_bytes=facts.memory_bytes or 0,  # 0: shares host memory
        compute_units=required(facts.compute_units, facts, "compute units"),
        idle_power_w=required(facts.idle_power_w, facts, "idle power"),
        max_power_w=required(facts.max_power_w, facts, "maximum power"),
        relative_speed=required(facts.relative_speed, facts, "relative speed"),
        onnx_providers=onnx_providers,
    )


PROFILES: dict[str, DeviceProfile] = {
    profile.name: profile
    for profile in (
        DeviceProfile(
            name="jetson-orin-nano",
            description="NVIDIA Jetson Orin Nano 8GB developer kit",
            cpu_model="ARM Cortex-A78AE",
            cpu_vendor="arm",
            cpu_cores=6,
            cpu_idle_power_w=1.5,
            cpu_max_power_w=5.0,
            cpu_relative_speed=0.004,
            memory_bytes=8 * GIB,
            arch="aarch64",
            accelerators=(_gpu("Jetson Orin Nano (Ampere, 1024 cores)", 1, integrated=True),),
            source="NVIDIA Jetson Orin Nano data sheet: 8 GB LPDDR5 shared, 7-15 W modes, 40 TOPS",
        ),
        DeviceProfile(
            name="jetson-agx-orin",
            description="NVIDIA Jetson AGX Orin 64GB developer kit",
            cpu_model="ARM Cortex-A78AE",
            cpu_vendor="arm",
            cpu_cores=12,
            cpu_idle_power_w=3.0,
            cpu_max_power_w=12.0,
            cpu_relative_speed=0.008,
            memory_bytes=64 * GIB,
            arch="aarch64",
            accelerators=(_gpu("Jetson AGX Orin (Ampere, 2048 cores)", 1, integrated=True),),
            source="NVIDIA Jetson AGX Orin data sheet: 64 GB shared, 15-60 W modes, 275 TOPS",
        ),
        DeviceProfile(
            name="raspberry-pi-5",
            description="Raspberry Pi 5 8GB, CPU only",
            cpu_model="ARM Cortex-A76 @ 2.4 GHz",
            cpu_vendor="arm",
            cpu_cores=4,
            cpu_idle_power_w=2.7,
            cpu_max_power_w=8.8,
            cpu_relative_speed=0.005,
            memory_bytes=8 * GIB,
            arch="aarch64",
            accelerators=(),
            source="Raspberry Pi 5 product brief; idle 2.7 W, stress 8.8 W (Pi Foundation)",
        ),
        DeviceProfile(
            name="intel-core-ultra-npu-gateway",
            description="Industrial gateway with Intel Core Ultra 7 155H (Meteor Lake) and its NPU",
            cpu_model="Intel Core Ultra 7 155H",
            cpu_vendor="intel",
            cpu_cores=22,
            cpu_idle_power_w=6.0,
            cpu_max_power_w=28.0,
            cpu_relative_speed=0.02,
            memory_bytes=32 * GIB,
            arch="x86_64",
            accelerators=(
                _npu(
                    "Intel Meteor Lake NPU",
                    model="Intel AI Boost NPU (Meteor Lake)",
                    onnx_providers=("OpenVINOExecutionProvider",),
                ),
            ),
            source="Intel Core Ultra 7 155H ARK: 28 W base power; NPU 11 TOPS, 2 compute engines",
        ),
        DeviceProfile(
            name="coral-edge-tpu-gateway",
            description="x86 mini PC with a Google Coral M.2 Edge TPU",
            cpu_model="Intel Celeron N5105",
            cpu_vendor="intel",
            cpu_cores=4,
            cpu_idle_power_w=3.0,
            cpu_max_power_w=10.0,
            cpu_relative_speed=0.004,
            memory_bytes=8 * GIB,
            arch="x86_64",
            accelerators=(
                # No ONNX Runtime execution provider exists for the Edge TPU (it runs TFLite),
                # so it advertises none: ONNX work can only use this node's CPU.
                _npu("Coral Edge TPU", onnx_providers=()),
            ),
            source="Coral M.2 Accelerator data sheet: 4 TOPS at 2 W; Celeron N5105 10 W TDP",
        ),
        DeviceProfile(
            name="t4-inference-server",
            description="1U inference server with one NVIDIA T4",
            cpu_model="Intel Xeon Silver 4314",
            cpu_vendor="intel",
            cpu_cores=32,
            cpu_idle_power_w=40.0,
            cpu_max_power_w=135.0,
            cpu_relative_speed=0.03,
            memory_bytes=128 * GIB,
            arch="x86_64",
            accelerators=(_gpu("Tesla T4", 1),),
            source="NVIDIA T4 data sheet: 16 GB GDDR6, 70 W, 40 SMs; Xeon Silver 4314 135 W TDP",
        ),
        DeviceProfile(
            name="h100-8x",
            description="HGX H100 8-GPU server (SXM5, 80 GB)",
            cpu_model="Intel Xeon Platinum 8480+",
            cpu_vendor="intel",
            cpu_cores=224,
            cpu_idle_power_w=200.0,
            cpu_max_power_w=700.0,
            cpu_relative_speed=0.1,
            memory_bytes=2048 * GIB,
            arch="x86_64",
            accelerators=(_gpu("NVIDIA H100 80GB HBM3", 8),),
            source="NVIDIA H100 SXM5 data sheet: 80 GB HBM3, up to 700 W, 132 SMs",
            typical_utilization=0.6,
        ),
        DeviceProfile(
            name="a100-4x",
            description="4-GPU A100 server (SXM4, 80 GB)",
            cpu_model="AMD EPYC 7763",
            cpu_vendor="amd",
            cpu_cores=128,
            cpu_idle_power_w=120.0,
            cpu_max_power_w=560.0,
            cpu_relative_speed=0.08,
            memory_bytes=1024 * GIB,
            arch="x86_64",
            accelerators=(_gpu("NVIDIA A100-SXM4-80GB", 4),),
            source="NVIDIA A100 data sheet: 80 GB HBM2e, 400 W SXM4, 108 SMs",
            typical_utilization=0.55,
        ),
        DeviceProfile(
            name="v100-8x",
            description="DGX-1 class 8-GPU V100 server (SXM2, 32 GB)",
            cpu_model="Intel Xeon E5-2698 v4",
            cpu_vendor="intel",
            cpu_cores=80,
            cpu_idle_power_w=100.0,
            cpu_max_power_w=270.0,
            cpu_relative_speed=0.04,
            memory_bytes=512 * GIB,
            arch="x86_64",
            accelerators=(_gpu("Tesla V100-SXM2-32GB", 8),),
            source="NVIDIA V100 data sheet: 32 GB HBM2, 300 W SXM2, 80 SMs",
            typical_utilization=0.5,
        ),
        DeviceProfile(
            name="a100-mig",
            description="2-GPU A100 server (SXM4, 80 GB), GPU 0 in MIG mode as 7 × 1g.10gb",
            cpu_model="AMD EPYC 7763",
            cpu_vendor="amd",
            cpu_cores=64,
            cpu_idle_power_w=90.0,
            cpu_max_power_w=280.0,
            cpu_relative_speed=0.08,
            memory_bytes=512 * GIB,
            arch="x86_64",
            accelerators=(
                replace(_gpu("NVIDIA A100-SXM4-80GB", 1), mig_profile="1g.10gb"),
                _gpu("NVIDIA A100-SXM4-80GB", 1),
            ),
            source="NVIDIA A100 data sheet and MIG user guide: 7 × 1g.10gb instances per GPU",
            typical_utilization=0.55,
        ),
        # One-GPU servers, as the design article's bank counts them (its "20 GPU servers").
        DeviceProfile(
            name="h100-1x",
            description="1-GPU H100 server (PCIe, 80 GB)",
            cpu_model="AMD EPYC 9334",
            cpu_vendor="amd",
            cpu_cores=64,
            cpu_idle_power_w=80.0,
            cpu_max_power_w=210.0,
            cpu_relative_speed=0.05,
            memory_bytes=256 * GIB,
            arch="x86_64",
            accelerators=(_gpu("NVIDIA H100 80GB HBM3", 1),),
            source="NVIDIA H100 data sheet (as the 8-GPU server's GPU); EPYC 9334 210 W TDP",
            typical_utilization=0.6,
        ),
        DeviceProfile(
            name="v100-1x",
            description="1-GPU V100 server (32 GB)",
            cpu_model="Intel Xeon Silver 4216",
            cpu_vendor="intel",
            cpu_cores=32,
            cpu_idle_power_w=40.0,
            cpu_max_power_w=100.0,
            cpu_relative_speed=0.02,
            memory_bytes=192 * GIB,
            arch="x86_64",
            accelerators=(_gpu("Tesla V100-SXM2-32GB", 1),),
            source="NVIDIA V100 data sheet (as the 8-GPU server's GPU); Xeon Silver 4216 100 W TDP",
            typical_utilization=0.5,
        ),
    )
}


def clamped_power_limit_w(accelerator: Accelerator, limit_w: float) -> float | None:
    """The power limit a simulated GPU holds when asked for `limit_w`: clamped, as a
    driver's constraints clamp it, between the model's lowest limit (shared.accelerators)
    and its default (`max_power_w`). None: the device has no power limit to set."""
    default_w = accelerator.max_power_w
    if accelerator.kind != "gpu" or not default_w:
        return None
    return min(default_w, max(lowest_power_share(accelerator.model) * default_w, limit_w))


def get_profile(name: str) -> DeviceProfile:
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise KeyError(f"unknown device profile {name!r}; known profiles: {known}") from None
