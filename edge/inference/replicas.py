"""Whether this node can take an inference replica, and on which provider.

Checked before anything is downloaded: the assigned accelerators must be this node's
and of the assigned kind, and one of the deployment's accepted ONNX Runtime
execution providers (in its order of preference) must be offered by all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.messages import Accelerator, DesiredDeployment, common_providers


def check_assignment(
    replica: DesiredDeployment, inventory: Sequence[Accelerator]
) -> tuple[str | None, str | None]:
    """(provider to ask for, None), or (None, why this node cannot take the replica)."""
    by_id = {accelerator.id: accelerator for accelerator in inventory}
    devices = []
    for device_id in replica.accelerator_ids:
        device = by_id.get(device_id)
        if device is None:
            return None, f"accelerator {device_id} is not on this node"
        if device.kind != replica.accelerator_kind:
            return None, (
                f"accelerator {device_id} is a {device.kind}, not a {replica.accelerator_kind}"
            )
        devices.append(device)
    if not devices:
        devices = [a for a in inventory if a.kind == replica.accelerator_kind][:1]
        if not devices:
            return None, f"this node has no {replica.accelerator_kind}"
    common = common_providers(devices)
    if replica.providers:
        usable = [p for p in replica.providers if p in common]
        if not usable:
            return None, (
                f"none of the accepted providers {list(replica.providers)} is usable here "
                f"(offered: {sorted(common)})"
            )
        return usable[0], None
    return (common[0] if common else None), None
