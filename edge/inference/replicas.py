"""Desired inference replicas -> reported replica states.

For every replica in the node's `desired` document the agent checks what it can
check without the model: that the assigned accelerators are this node's and of the
assigned kind, and which of the accepted ONNX Runtime execution providers those
devices offer (the first, in the deployment's order of preference). A replica that
passes is reported `ready` with that provider; one that does not is `failed` with
the reason, and never disturbs the others.

Loading and serving the model itself is the inference runtime's job (docs/rest.md
lists what deployments do today); this module is the part of the agent that
accepts or refuses an assignment.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.messages import Accelerator, DesiredDeployment, ReportedDeployment

ReplicaKey = tuple[str, int]


def _accept(replica: DesiredDeployment, inventory: dict[str, Accelerator]) -> ReportedDeployment:
    def failed(reason: str) -> ReportedDeployment:
        return ReportedDeployment(
            deployment_id=replica.deployment_id,
            replica=replica.replica,
            state="failed",
            reason=reason,
        )

    devices = []
    for device_id in replica.accelerator_ids:
        device = inventory.get(device_id)
        if device is None:
            return failed(f"accelerator {device_id} is not on this node")
        if device.kind != replica.accelerator_kind:
            return failed(
                f"accelerator {device_id} is a {device.kind}, not a {replica.accelerator_kind}"
            )
        devices.append(device)
    if not devices:
        devices = [a for a in inventory.values() if a.kind == replica.accelerator_kind][:1]
        if not devices:
            return failed(f"this node has no {replica.accelerator_kind}")
    offered = [set(device.onnx_providers) for device in devices]
    common = offered[0].intersection(*offered[1:])
    if replica.providers:
        usable = [p for p in replica.providers if p in common]
        if not usable:
            return failed(
                f"none of the accepted providers {list(replica.providers)} is usable here "
                f"(offered: {sorted(common)})"
            )
        provider: str | None = usable[0]
    else:
        provider = next((p for p in devices[0].onnx_providers if p in common), None)
    return ReportedDeployment(
        deployment_id=replica.deployment_id,
        replica=replica.replica,
        state="ready",
        provider=provider,
    )


class ReplicaReconciler:
    """Keeps one reported state per desired replica; synchronous and cheap."""

    def __init__(self, inventory: Sequence[Accelerator]) -> None:
        self._inventory = {accelerator.id: accelerator for accelerator in inventory}
        self._states: dict[ReplicaKey, ReportedDeployment] = {}
        self._specs: dict[ReplicaKey, DesiredDeployment] = {}

    def apply(self, desired: Sequence[DesiredDeployment]) -> bool:
        """Accept new or changed replicas, forget withdrawn ones; True when anything changed."""
        wanted = {(replica.deployment_id, replica.replica): replica for replica in desired}
        changed = set(self._specs) != set(wanted)
        for key in set(self._specs) - set(wanted):
            del self._specs[key]
            del self._states[key]
        for key, replica in wanted.items():
            if self._specs.get(key) == replica:
                continue
            self._specs[key] = replica
            self._states[key] = _accept(replica, self._inventory)
            changed = True
        return changed

    def reported(self) -> tuple[ReportedDeployment, ...]:
        return tuple(state for _, state in sorted(self._states.items()))
