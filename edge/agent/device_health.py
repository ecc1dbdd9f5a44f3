"""Where the agent judges whether its GPUs work: a GPU that gives no reading for
`FAILED_ROUNDS` telemetry rounds in a row is unhealthy (its driver no longer answers
for it: NVML errors, a GPU lost from the bus; the probe's log line says which), and
one reading makes it healthy again. A GPU its probe reports faulted (a critical XID
event, edge/discovery/nvidia.py) is unhealthy for as long as the probe says so.
Each change is announced in a new birth (the inventory's `healthy` and `health`),
so the control plane stops placing work on it and moves what ran there, or uses it
again.

Only GPUs are judged: other probes (CPU, NPUs) may legitimately have no reading for
a device they found.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import msgspec

from shared.messages import Accelerator

FAILED_ROUNDS = 2
UNHEALTHY_REASON = "no reading from its driver for {rounds} telemetry rounds (see the agent log)"


class DeviceHealth:
    def __init__(self, inventory: Sequence[Accelerator]) -> None:
        self._judged = tuple(a.id for a in inventory if a.kind == "gpu")
        self._misses: dict[str, int] = {}
        self.unhealthy: dict[str, str] = {}  # accelerator id -> why

    def observe(
        self, sampled_ids: Collection[str], faults: Mapping[str, str] | None = None
    ) -> bool:
        """One telemetry round's readings and the probes' faults (id -> why); whether
        any GPU's health changed."""
        changed = False
        for accelerator_id in self._judged:
            fault = faults.get(accelerator_id) if faults else None
            if fault is not None:
                changed |= self.unhealthy.get(accelerator_id) != fault
                self.unhealthy[accelerator_id] = fault
                continue
            if accelerator_id in sampled_ids:
                self._misses.pop(accelerator_id, None)
                changed |= self.unhealthy.pop(accelerator_id, None) is not None
                continue
            misses = self._misses.get(accelerator_id, 0) + 1
            self._misses[accelerator_id] = misses
            if misses >= FAILED_ROUNDS and accelerator_id not in self.unhealthy:
                self.unhealthy[accelerator_id] = UNHEALTHY_REASON.format(rounds=misses)
                changed = True
        return changed

    def inventory(self, accelerators: Sequence[Accelerator]) -> tuple[Accelerator, ...]:
        """`accelerators` with their current health."""
        return tuple(
            msgspec.structs.replace(a, healthy=False, health=self.unhealthy[a.id])
            if a.id in self.unhealthy
            else a
            for a in accelerators
        )
