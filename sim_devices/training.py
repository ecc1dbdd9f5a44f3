"""Simulated training workers: they take as long as the job's reference duration
scaled by the speed of the accelerators they were given, then succeed. A worker
whose GPUs are held to a power limit runs slower, as capped hardware trains
(shared.accelerators.capped_throughput at the limit's share of the default).

A simulated node reports the strongest isolation (`sandbox`, as a provisioned node
would) and runs a worker only once the job's sealed secrets open with the node's own
key (shared/sealing.py), so sealing is exercised end to end.

A job sent with `env = { GREENFED_SIM_EXIT_CODE = "3" }` fails with that code,
so failure handling can be exercised end to end on a simulated fleet; with
`GREENFED_SIM_FAILING_ATTEMPTS = "2"` as well, only its first two attempts fail (a
flaky job its retry policy gets through).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Final

from edge.training.environment import process_count, unrunnable_reason
from edge.training.output import OutputBuffer
from edge.training.runs import RejectedRun, RunStatus, TrainingRun
from shared.accelerators import capped_throughput
from shared.messages import Accelerator, DesiredTraining, IsolationLevel
from shared.sealing import SealedSecretsError
from shared.worker_secrets import open_worker_secrets
from sim_devices.profiles import clamped_power_limit_w

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

# What a simulated training node reports of itself (as a provisioned node would).
SIMULATED_ISOLATION: Final[IsolationLevel] = "sandbox"
SIMULATED_RUNTIMES: Final = ("podman",)

# Without a reference duration a simulated worker runs this long.
DEFAULT_SIMULATED_DURATION_S = 60.0
SIMULATED_EXIT_CODE_VARIABLE = "GREENFED_SIM_EXIT_CODE"
SIMULATED_FAILING_ATTEMPTS_VARIABLE = "GREENFED_SIM_FAILING_ATTEMPTS"


def simulated_runtime_s(spec: DesiredTraining, inventory: Sequence[Accelerator]) -> float:
    """Reference duration / relative speed of the slowest assigned accelerator, each
    held to the worker's power limit (clamped as the simulated GPU clamps it)."""
    reference_s = spec.reference_duration_s or DEFAULT_SIMULATED_DURATION_S
    speeds = [
        _capped_speed(a, spec.power_limit_w)
        for a in inventory
        if a.id in spec.accelerator_ids and a.relative_speed
    ]
    return reference_s / min(speeds) if speeds else reference_s


def _capped_speed(accelerator: Accelerator, power_limit_w: float | None) -> float:
    speed = accelerator.relative_speed or 0.0
    held_w = None if power_limit_w is None else clamped_power_limit_w(accelerator, power_limit_w)
    if held_w is None or not accelerator.max_power_w:
        return speed
    return speed * capped_throughput(held_w / accelerator.max_power_w)


class SimulatedRun:
    outlives_agent = False  # it runs in the agent's process

    def __init__(
        self, spec: DesiredTraining, runtime_s: float, wall_clock: Callable[[], float]
    ) -> None:
        self.status = RunStatus(spec.job_id, spec.attempt, wall_clock=wall_clock)
        self.output = OutputBuffer()
        self.spec = spec
        self.runtime_s = runtime_s
        self._exit_code = int(spec.env.get(SIMULATED_EXIT_CODE_VARIABLE, "0") or 0)
        failing = spec.env.get(SIMULATED_FAILING_ATTEMPTS_VARIABLE)
        if failing and spec.attempt > int(failing):
            self._exit_code = 0
        self._stop_reason: str | None = None
        self._stop_requested = asyncio.Event()
        self._finished = asyncio.Event()

    async def run(self) -> None:
        try:
            self.status.mark_running()
            devices = ",".join(self.spec.accelerator_ids) or "no accelerator"
            last_rank = self.spec.rank + process_count(self.spec) - 1
            ranks = (
                f"{self.spec.rank}"
                if last_rank == self.spec.rank
                else f"{self.spec.rank}-{last_rank}"
            )
            self._print(
                f"simulated worker {ranks}/{self.spec.world_size} of "
                f"{self.spec.job_id} on {devices}: {self.runtime_s:.1f} s"
            )
            try:
                async with asyncio.timeout(self.runtime_s):
                    await self._stop_requested.wait()
            except TimeoutError:
                self._print(f"simulated worker finished with exit code {self._exit_code}")
                if self._exit_code == 0:
                    self.status.mark_finished("succeeded", 0, "")
                else:
                    self.status.mark_finished(
                        "failed", self._exit_code, f"exit code {self._exit_code}"
                    )
            else:
                self.status.mark_finished("stopped", None, self._stop_reason or "")
        finally:
            if not self.status.finished:
                self.status.mark_finished("stopped", None, "agent stopped")
            self._finished.set()

    def _print(self, line: str) -> None:
        self.output.append(f"{line}\n".encode())

    async def stop(self, reason: str) -> None:
        if self.status.finished:
            return
        self._stop_reason = reason
        self._stop_requested.set()
        await self._finished.wait()


class SimulatedLauncher:
    def __init__(
        self,
        inventory: Sequence[Accelerator],
        wall_clock: Callable[[], float] = time.time,
        *,
        node_id: str = "",
        sealing_key: X25519PrivateKey | None = None,
    ) -> None:
        self._inventory = tuple(inventory)
        self._wall_clock = wall_clock
        self._node_id = node_id
        self._sealing_key = sealing_key

    def adopt(self, spec: DesiredTraining) -> SimulatedRun | None:
        return None  # simulated workers end with their agent

    def leftovers(self, claimed: Collection[tuple[str, int]]) -> list[SimulatedRun]:
        return []

    def prepare(self, spec: DesiredTraining) -> TrainingRun:
        refusal = unrunnable_reason(spec, self._inventory)
        if refusal:
            return RejectedRun(spec, refusal)
        try:
            open_worker_secrets(spec, self._sealing_key, self._node_id)
        except SealedSecretsError as error:
            return RejectedRun(spec, f"cannot start: {error}")
        return SimulatedRun(spec, simulated_runtime_s(spec, self._inventory), self._wall_clock)
