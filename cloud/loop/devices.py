"""Which of a node's devices an allocation gets.

The scheduler decides *how many* accelerators of a kind a worker gets on a node;
the agent needs to know *which* (CUDA_VISIBLE_DEVICES). Devices are handed out in
id order from those no live allocation holds, so the choice is deterministic and
a restarted control plane makes the same one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from shared.messages import Accelerator, AcceleratorKind


class NotEnoughDevices(RuntimeError):
    pass


def pick_devices(
    inventory: Sequence[Accelerator],
    kind: AcceleratorKind,
    count: int,
    held: Iterable[str],
    model: str = "",
) -> tuple[str, ...]:
    """`count` free, healthy device ids of `kind` (and `model`, the scheduler's pool,
    when given) on a node, lowest ids first. CPU cores are not pinned (the pool counts
    cores; the operating system places the threads): ()."""
    if kind == "cpu":
        return ()
    taken = set(held)
    pool = [a for a in inventory if a.kind == kind and (not model or a.model == model)]
    free = sorted((a.id for a in pool if a.healthy and a.id not in taken), key=_natural_key)
    if len(free) < count:
        what = f"{kind} {model}" if model else kind
        raise NotEnoughDevices(f"{count} {what} wanted, {len(free)} free of {len(pool)}")
    return tuple(free[:count])


def _natural_key(device_id: str) -> tuple[tuple[int, int | str], ...]:
    """gpu2 before gpu10; gpu0-mig1 before gpu0-mig10."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part)
        for part in re.split(r"(\d+)", device_id)
        if part
    )
